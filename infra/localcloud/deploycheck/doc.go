// Package deploycheck checks the deployment's HCL (infra/gcp) against the
// Go that it deploys, so the two cannot drift apart unnoticed. It has only
// tests.
package deploycheck
