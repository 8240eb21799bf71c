// Module tfproviders builds the Terraform providers that infra/gcp uses, so
// "tofu validate" checks every resource against the real provider schemas
// offline (dev_overrides in a generated CLI config; no registry download).
// The versions are the providers' main branches as served by the Go module
// proxy (their release tags are not Go-module versions).
module github.com/raydrop/raydrop/infra/tools/tfproviders

go 1.26.3

tool (
	github.com/hashicorp/terraform-provider-archive
	github.com/hashicorp/terraform-provider-google
	github.com/hashicorp/terraform-provider-kubernetes
)

require (
	github.com/hashicorp/terraform-provider-archive v1.3.1-0.20260727144921-44050a6fd1aa
	github.com/hashicorp/terraform-provider-google v1.20.1-0.20260828184646-f3721fb45fa3
	github.com/hashicorp/terraform-provider-kubernetes v1.13.4-0.20260821094251-3a33fb6cc605
)
