// Package e2e is raydrop's end-to-end suite: every scenario a user meets
// (success, failures and retries, cancellation, queueing, duplicates and
// lost messages, capacity fallback and preemption, the data check, the
// event bus, the report in a browser, the CLI), played on one local cloud
// (package stack) with the real functions, emulators, kube-apiserver and
// KubeRay reconcilers. Scenarios run side by side, each on its own
// cluster. Its tests are all it holds.
package e2e
