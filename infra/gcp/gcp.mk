# infra/gcp/gcp.mk — the Google Cloud deployment: OpenTofu and the Terraform
# providers, built once per machine into RAYDROP_CACHE like the other tools,
# the offline check of the HCL, and deploy / destroy. Included by the Makefile.

TOFU_VERSION := v1.10.10
TOFU := $(RAYDROP_CACHE)/bin/tofu-$(TOFU_VERSION)
# The providers' main branches as the Go module proxy serves them (pinned in
# infra/tools/tfproviders/<name>/go.mod, one module per provider so each builds
# with the dependency versions its own go.mod resolves). dev_overrides wants a
# folder per provider.
TF_GOOGLE_VERSION := v1.20.1-0.20260828184646-f3721fb45fa3
TF_KUBERNETES_VERSION := v1.13.4-0.20260821094251-3a33fb6cc605
TF_ARCHIVE_VERSION := v1.3.1-0.20260727144921-44050a6fd1aa
TF_PROVIDERS := $(RAYDROP_CACHE)/tfproviders
TF_GOOGLE := $(TF_PROVIDERS)/google-$(TF_GOOGLE_VERSION)/terraform-provider-google
TF_KUBERNETES := $(TF_PROVIDERS)/kubernetes-$(TF_KUBERNETES_VERSION)/terraform-provider-kubernetes
TF_ARCHIVE := $(TF_PROVIDERS)/archive-$(TF_ARCHIVE_VERSION)/terraform-provider-archive

# The configuration infra-check checks (another folder: make infra-check INFRA_DIR=...).
INFRA_DIR ?= infra/gcp
# deploy and destroy: the cached tofu, else tofu or terraform on the PATH,
# else the cached tofu built first. Extra flags: DEPLOY_FLAGS=-auto-approve.
INFRA_TF = $(or $(wildcard $(TOFU)),$(shell command -v tofu),$(shell command -v terraform),$(TOFU))
INFRA_VARS ?= terraform.tfvars
DEPLOY_FLAGS ?=
# make deploy first checks the region's GPU quota for the capacity tiers
# the job specs use, and the GKE version flex-start needs
# (infra/gcp/preflight; PREFLIGHT=0 skips it). Its flags, e.g.
# PREFLIGHT_FLAGS="-specs jobs/a.json,jobs/b.json" (the tiers, accelerator
# and GPUs of those specs) or "-tiers reservation,flexStart,spot -gpus 16".
PREFLIGHT ?= 1
PREFLIGHT_FLAGS ?=

##@ Google Cloud (infra/gcp; see infra/gcp/README.md)

.PHONY: infra-tools
infra-tools: $(TOFU) $(TF_GOOGLE) $(TF_KUBERNETES) $(TF_ARCHIVE) ## OpenTofu and the google, kubernetes and archive providers for the offline check

INFRA_CHECK_ENV = TOFU=$(TOFU) PROVIDERS="$(dir $(TF_GOOGLE)) $(dir $(TF_KUBERNETES)) $(dir $(TF_ARCHIVE))"

.PHONY: infra-check
infra-check: infra-tools infra-plan ## Offline check of the HCL (infra/gcp, examples/subscriber): tofu fmt -check and tofu validate against the real provider schemas; then proves it fails on broken copies
	$(INFRA_CHECK_ENV) infra/gcp/check.sh $(INFRA_DIR)
	$(INFRA_CHECK_ENV) infra/gcp/check.sh examples/subscriber
	@set -eu; for fault in unknown-argument unformatted; do \
	  tmp=$$(mktemp -d); cp -r infra/gcp/*.tf $$tmp/; \
	  case $$fault in \
	    unknown-argument) sed -i '0,/^  location/s//  not_an_argument = true\n  location/' $$tmp/main.tf; $(TOFU) fmt $$tmp >/dev/null; want='Unsupported argument' ;; \
	    unformatted) printf 'variable "x" {\ndefault="y"\n}\n' >> $$tmp/variables.tf; want='variables.tf' ;; \
	  esac; \
	  if $(INFRA_CHECK_ENV) infra/gcp/check.sh $$tmp >$$tmp.log 2>&1 || ! grep -q "$$want" $$tmp.log; then \
	    echo "infra-check: a copy with an $$fault was not refused for it" >&2; cat $$tmp.log >&2; rm -rf $$tmp $$tmp.log; exit 1; \
	  fi; \
	  echo "infra-check: a copy with an $$fault fails the check, as it must"; rm -rf $$tmp $$tmp.log; \
	done

# The plan tests (infra/gcp/tests, examples/subscriber/tests): tofu test,
# command = plan, with the real google provider offline and the data sources,
# kubernetes and archive stood in for. Then broken copies of infra/gcp, each
# of which tofu validate accepts (checked) and the plan tests must refuse:
#   wrong-reference  the marks notification names a topic key that is not there
#   missing-grant    every function's clusterViewer grant bound to one account
#   unknown-for-each a for_each over a value known only after apply
.PHONY: infra-plan
infra-plan: infra-tools ## Offline plan tests of the HCL (tofu test with mocks) for the configurations users have; then proves they fail on broken copies that validate accepts
	$(INFRA_CHECK_ENV) infra/gcp/check.sh --plan infra/gcp
	$(INFRA_CHECK_ENV) infra/gcp/check.sh --plan examples/subscriber
	@set -eu; for fault in wrong-reference missing-grant unknown-for-each; do \
	  tmp=$$(mktemp -d); cp -r infra/gcp/*.tf infra/gcp/tests $$tmp/; \
	  case $$fault in \
	    wrong-reference) sed -i 's/google_pubsub_topic.topics\["marks"\].id/google_pubsub_topic.topics["mark"].id/' $$tmp/main.tf; want='Invalid index' ;; \
	    missing-grant) sed -i '/"roles\/container.clusterViewer"/{n;s/function\[each.key\]/function["provision"]/}' $$tmp/functions.tf; want='Grants the wiring table needs and the plan lacks' ;; \
	    unknown-for-each) sed -i 's/for_each = toset(var.data_buckets)/for_each = toset(concat(var.data_buckets, [google_storage_bucket.artifacts.self_link]))/' $$tmp/gke.tf; want='Invalid for_each argument' ;; \
	  esac; \
	  if cmp -s $$tmp/main.tf infra/gcp/main.tf && cmp -s $$tmp/functions.tf infra/gcp/functions.tf && cmp -s $$tmp/gke.tf infra/gcp/gke.tf; then \
	    echo "infra-plan: the $$fault fault no longer applies to the HCL" >&2; rm -rf $$tmp; exit 1; \
	  fi; \
	  if ! $(INFRA_CHECK_ENV) infra/gcp/check.sh $$tmp >$$tmp.log 2>&1; then \
	    echo "infra-plan: tofu validate already refuses the $$fault copy; pick a fault only a plan finds" >&2; cat $$tmp.log >&2; rm -rf $$tmp $$tmp.log; exit 1; \
	  fi; \
	  if TF_VAR_source_dir=$(CURDIR) $(INFRA_CHECK_ENV) infra/gcp/check.sh --plan $$tmp >$$tmp.log 2>&1 || ! grep -q "$$want" $$tmp.log; then \
	    echo "infra-plan: a copy with a $$fault was not refused for it" >&2; cat $$tmp.log >&2; rm -rf $$tmp $$tmp.log; exit 1; \
	  fi; \
	  echo "infra-plan: a copy with a $$fault passes validate and fails the plan tests, as it must"; rm -rf $$tmp $$tmp.log; \
	done

.PHONY: deploy
deploy: $(if $(filter $(TOFU),$(INFRA_TF)),$(TOFU)) ## Deploy to Google Cloud: the GPU quota and version check (PREFLIGHT=0 skips it), then init + apply with infra/gcp/terraform.tfvars (needs credentials and network)
	@test -f infra/gcp/$(INFRA_VARS) || { echo "deploy: copy infra/gcp/terraform.tfvars.example to infra/gcp/$(INFRA_VARS) and fill it in" >&2; exit 1; }
	$(if $(filter 1,$(PREFLIGHT)),$(GO) run ./infra/gcp/preflight -tfvars infra/gcp/$(INFRA_VARS) $(PREFLIGHT_FLAGS))
	$(INFRA_TF) -chdir=infra/gcp init -input=false
	$(INFRA_TF) -chdir=infra/gcp apply -var-file=$(INFRA_VARS) $(DEPLOY_FLAGS)
	@echo 'deploy: point the CLI at it with: eval "$$(make -s deploy-env)"'

.PHONY: destroy
destroy: $(if $(filter $(TOFU),$(INFRA_TF)),$(TOFU)) ## Remove the deployment from Google Cloud
	@test -f infra/gcp/$(INFRA_VARS) || { echo "destroy: infra/gcp/$(INFRA_VARS) is missing" >&2; exit 1; }
	$(INFRA_TF) -chdir=infra/gcp init -input=false
	$(INFRA_TF) -chdir=infra/gcp destroy -var-file=$(INFRA_VARS) $(DEPLOY_FLAGS)

.PHONY: deploy-env
deploy-env: ## Print the export lines (RAYDROP_PROJECT, RAYDROP_INTAKE_BUCKET, RAYDROP_STATE_BUCKET) that point the CLI at the deployment
	@$(INFRA_TF) -chdir=infra/gcp output -raw cli_env

$(TOFU):
	@mkdir -p $(dir $@)
	@echo "tools: building OpenTofu $(TOFU_VERSION) (first time on this machine: about 3 minutes)"
	cd infra/tools/tofu && $(GO) build -trimpath -ldflags="-s -X github.com/opentofu/opentofu/version.dev=no" -o $@.tmp github.com/opentofu/opentofu/cmd/tofu
	@mv $@.tmp $@

$(TF_GOOGLE):
	@mkdir -p $(dir $@)
	@echo "tools: building terraform-provider-google (first time on this machine: about 3 minutes)"
	cd infra/tools/tfproviders/google && $(GO) build -trimpath -ldflags=-s -o $@.tmp github.com/hashicorp/terraform-provider-google
	@mv $@.tmp $@

$(TF_KUBERNETES):
	@mkdir -p $(dir $@)
	@echo "tools: building terraform-provider-kubernetes (first time on this machine: about 2 minutes)"
	cd infra/tools/tfproviders/kubernetes && $(GO) build -trimpath -ldflags=-s -o $@.tmp github.com/hashicorp/terraform-provider-kubernetes
	@mv $@.tmp $@

$(TF_ARCHIVE):
	@mkdir -p $(dir $@)
	@echo "tools: building terraform-provider-archive (first time on this machine: under a minute)"
	cd infra/tools/tfproviders/archive && $(GO) build -trimpath -ldflags=-s -o $@.tmp github.com/hashicorp/terraform-provider-archive
	@mv $@.tmp $@
