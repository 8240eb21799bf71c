// Module tofu builds OpenTofu for the offline check of infra/gcp and for
// make deploy. github.com/opentofu/opentofu cannot be installed with
// "go install" because its go.mod replaces github.com/hashicorp/hcl/v2 with
// OpenTofu's fork; this wrapper carries that same replace.
module github.com/raydrop/raydrop/infra/tools/tofu

go 1.26

tool github.com/opentofu/opentofu/cmd/tofu

require github.com/opentofu/opentofu v1.10.10

replace github.com/hashicorp/hcl/v2 v2.20.1 => github.com/opentofu/hcl/v2 v2.20.2-0.20251021132045-587d123c2828
