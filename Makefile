# raydrop — make help lists the targets.
#
# Every tool is pinned and built by this Makefile into RAYDROP_CACHE, outside
# the clone, keyed by version, so a fresh machine needs nothing but `make run`
# and `make test`, and every clone on the machine reuses what one built.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

RAYDROP_CACHE ?= $(HOME)/.cache/raydrop
GO ?= go

KUBE_VERSION := v1.34.1
ETCD_VERSION := v3.6.4
# kube-apiserver is built with its version stamped in, as a release is (clients
# such as Kueue read it from /version and refuse "v0.0.0-master").
KUBE_BIN := $(RAYDROP_CACHE)/kube-$(KUBE_VERSION)-stamped-etcd-$(ETCD_VERSION)
KUBE_LDFLAGS := -s $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(KUBE_VERSION) -X $(p).gitMajor=$(word 1,$(subst ., ,$(KUBE_VERSION:v%=%))) -X $(p).gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION:v%=%))) -X $(p).gitTreeState=clean)
FAKE_GCS_VERSION := v1.56.1
# fake-gcs-server is built with the local cloud's indexed in-memory store
# (infra/tools/fakegcs/backend/memory.go), keyed by that store's hash too.
FAKE_GCS_STORE := $(shell cat infra/tools/fakegcs/build.sh infra/tools/fakegcs/backend/memory.go | sha256sum | cut -c1-12)
FAKE_GCS := $(RAYDROP_CACHE)/bin/fake-gcs-server-$(FAKE_GCS_VERSION)-store-$(FAKE_GCS_STORE)
# Marks the build whose own tests passed (a dot file: never taken for the binary).
FAKE_GCS_TESTED := $(RAYDROP_CACHE)/bin/.tested-fake-gcs-server-$(FAKE_GCS_VERSION)-store-$(FAKE_GCS_STORE)
# Kueue's controller manager, built from its release as its own binary, with
# the release's CRDs and webhook manifests beside it (RAYDROP_KUEUE).
KUEUE_VERSION := v0.17.0
KUEUE_DIR := $(RAYDROP_CACHE)/kueue-$(KUEUE_VERSION)
# Kueue $(KUEUE_VERSION) reads its metrics certificate from this fixed path when
# its own certificate management is off (as in the local cloud).
KUEUE_METRICS_CERTS := /etc/kueue/metrics/certs
GOLANGCI_VERSION := v2.15.0
GOLANGCI := $(RAYDROP_CACHE)/bin/golangci-lint-$(GOLANGCI_VERSION)

# The API tests start etcd and kube-apiserver from here (controller-runtime's envtest).
export KUBEBUILDER_ASSETS := $(KUBE_BIN)
export RAYDROP_CACHE
export RAYDROP_FAKE_GCS := $(FAKE_GCS)
export RAYDROP_KUEUE := $(KUEUE_DIR)

# Debian's Chromium renders the run report in the end-to-end suite's browser
# test; it comes from the machine's package registry (apt: as root, or sudo).
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

GO_TEST_FLAGS ?= -race -shuffle=on -count=1
# Every Go build leaves the clone's own path out of what it compiles, so the
# build cache serves each clone on the machine: a fresh clone (CI's) compiles
# only the packages that changed, not the whole module again.
export GOFLAGS := $(strip $(filter-out -trimpath,$(GOFLAGS)) -trimpath)
LAYOUT_DIR := $(CURDIR)/.build/trainer-layout

##@ Getting started

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*##"} /^##@/ {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The tools and the trainer's virtualenv (which runs the data check) are built
# side by side: the Go builds keep the CPUs busy, the virtualenv's download the
# network.
.PHONY: run
run: ## The example job end to end on the local cloud (no account needed)
	$(MAKE) --no-print-directory -j3 tools trainer-venv
	cd infra/localcloud && RAYDROP_TRAINER_PYTHON=$(TRAINER_VENV)/bin/python $(GO) run ./cmd/localcloud run --repo ../..

.PHONY: dev
dev: ## Start the local cloud and keep it up (prints the variables that point clients at it)
	$(MAKE) --no-print-directory -j3 tools trainer-venv
	cd infra/localcloud && RAYDROP_TRAINER_PYTHON=$(TRAINER_VENV)/bin/python $(GO) run ./cmd/localcloud dev --repo ../..

##@ Development

# The parts of make test, as lanes: the parts of a lane run one after
# another, lanes side by side (infra/tools/test-parts.sh prints each part's
# time at the end). The local cloud's suites mostly wait on their clouds
# (ticks, simulated steps, retries' back-off), so they run beside the
# parts that keep the CPUs busy: the proof suite, the longest part, from
# the start in a lane of its own; the end-to-end suite, four tests at once,
# then the benchmark's smoke run in another; the lint, the Go tests and the
# trainer's in the third.
# TEST_LANES="lint go-test ..." runs one lane.
TEST_LANES ?= "cpu lint go-test trainer-unit trainer-contract" "localcloud infra-check localcloud-e2e bench-smoke" "proof proof"

.PHONY: test
test: tools $(FAKE_GCS_TESTED) $(GOLANGCI) infra-tools trainer-venv gemma3-tokenizer $(CHROMIUM) ## Everything CI runs: lint, Go tests, the HCL check, the end-to-end suite on the local cloud, trainer tests and the layout contract; prints each part's time
	MAKE="$(MAKE)" infra/tools/test-parts.sh $(TEST_LANES)

.PHONY: check
check: lint ## The inner loop: lint and the Go tests of the main module (cached results reused), against the real API server
	$(MAKE) --no-print-directory tools
	$(GO) test ./...

.PHONY: go-test
go-test: tools ## Go tests with the race detector against a real kube-apiserver + etcd
	$(GO) test $(GO_TEST_FLAGS) ./...

FUZZ_N ?= 10000
FUZZ_SEED ?= 1

.PHONY: fuzz
fuzz: ## Random interleavings of deliveries, crashes and cancellations against the real handlers (FUZZ_N=10000 from FUZZ_SEED=1; make test plays 60)
	$(GO) test -count=1 -timeout 120m -run TestRandomInterleavings ./functions/flow -args -interleavings $(FUZZ_N) -seed $(FUZZ_SEED)

.PHONY: localcloud-test
localcloud-test: tools $(CHROMIUM) trainer-venv ## The local cloud's own tests and the end-to-end suite on it, beside the proof suite on a local cloud of its own
	mkdir -p .build
	$(MAKE) --no-print-directory proof >.build/proof.log 2>&1 & proof=$$!; \
		status=0; $(MAKE) --no-print-directory localcloud-e2e || status=$$?; \
		wait $$proof || status=1; echo "localcloud-test: the proof suite (.build/proof.log):"; cat .build/proof.log; exit $$status

.PHONY: localcloud-e2e
localcloud-e2e: tools $(CHROMIUM) trainer-venv ## The local cloud's own tests and the end-to-end suite on it (the run report in a real Chromium too), four tests at once
	cd infra/localcloud && RAYDROP_CHROMIUM=$(CHROMIUM) RAYDROP_TRAINER_PYTHON=$(TRAINER_VENV)/bin/python \
		$(GO) test -count=1 -shuffle=on -parallel 4 -timeout 15m $$($(GO) list ./... | grep -v /proof)

.PHONY: proof
proof: tools trainer-venv ## The reliability and security suite on its own local cloud; prints a report per scenario (also .build/proof-report.json)
	mkdir -p .build && rm -f .build/proof-report.*
	cd infra/localcloud && status=0 && RAYDROP_PROOF_REPORT=$(CURDIR)/.build/proof-report.json RAYDROP_TRAINER_PYTHON=$(TRAINER_VENV)/bin/python $(GO) test -count=1 -timeout 25m ./proof || status=$$?; \
		cat $(CURDIR)/.build/proof-report.txt 2>/dev/null || true; exit $$status

.PHONY: trainer-contract
trainer-contract: trainer-venv ## Trainer tests under real Ray Train, then Go checkpoint discovery on the layout they wrote
	rm -rf $(LAYOUT_DIR) && mkdir -p $(LAYOUT_DIR)
	RAYDROP_LAYOUT_DIR=$(LAYOUT_DIR) $(MAKE) --no-print-directory trainer-test TRAINER_TESTS=$(TRAINER_RAY_TESTS)
	$(GO) test -count=1 -run TestTrainerLayoutContract -v ./pkg/checkpoints -args -layout $(LAYOUT_DIR)

.PHONY: trainer-unit
trainer-unit: trainer-venv ## The trainer's other tests (no Ray cluster), then the GPU benchmark's command on CPU
	$(MAKE) --no-print-directory trainer-test TRAINER_TESTS="--ignore=$(TRAINER_RAY_TESTS) tests"
	$(MAKE) --no-print-directory gpu-bench-dry-run

.PHONY: trainer-layout-testdata
trainer-layout-testdata: ## Refresh pkg/checkpoints/testdata/trainer-layout from the tree the last trainer-contract wrote (binaries emptied)
	@test -d $(LAYOUT_DIR)/exp-a || { echo "run make trainer-contract first" >&2; exit 1; }
	rm -rf pkg/checkpoints/testdata/trainer-layout && cp -r $(LAYOUT_DIR) pkg/checkpoints/testdata/trainer-layout
	cd pkg/checkpoints/testdata/trainer-layout && \
		find . \( -name '*.pkl' -o -name 'events.out.tfevents*' -o -name progress.csv -o -name '.raydrop-*' \) -delete && \
		find . -type f \( -name '*.safetensors' -o -name '*.pt' -o -name '*.pth' -o -name '*.bin' -o -name tokenizer.json \
			-o -name chat_template.jinja -o -name README.md \) -exec truncate -s 0 {} +
	du -sh pkg/checkpoints/testdata/trainer-layout

.PHONY: lint
lint: $(GOLANGCI) ## golangci-lint (pinned) and the formatting check, on both Go modules
	$(GOLANGCI) run ./...
	cd infra/localcloud && $(GOLANGCI) run --config ../../.golangci.yml ./...

.PHONY: fmt
fmt: $(GOLANGCI) ## Format the Go code
	$(GOLANGCI) fmt ./...

BENCH_FLAGS ?=
BENCH_ENV = RAYDROP_TRAINER_PYTHON=$(TRAINER_VENV)/bin/python RAYDROP_GEMMA3_TOKENIZER=$(GEMMA3_TOKENIZER)

.PHONY: bench
bench: tools trainer-venv gemma3-tokenizer ## Benchmarks that print figures, each beside the one docs/benchmarks.md quotes: Go micro-benchmarks, then the control plane and the data check on the local cloud (JSON in .build/bench.json)
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/...
	cd infra/localcloud && $(BENCH_ENV) $(GO) run ./cmd/bench -json $(CURDIR)/.build/bench.json $(BENCH_FLAGS)

.PHONY: bench-smoke
bench-smoke: tools trainer-venv gemma3-tokenizer ## Every section of the local cloud's benchmark, small: fails when a section breaks or produces no figure (asserts no timing)
	cd infra/localcloud && $(BENCH_ENV) $(GO) run ./cmd/bench -smoke -json $(CURDIR)/.build/bench-smoke.json

.PHONY: bench-docs
bench-docs: ## Make the last full make bench (.build/bench.json) the figures docs/benchmarks.md quotes (docs/benchmarks.json and its table)
	cd infra/localcloud && $(GO) run ./cmd/bench -update-docs $(CURDIR)/.build/bench.json

.PHONY: schema
schema: ## Regenerate the job spec JSON Schema (schemas/jobspec.v1.json)
	$(GO) test ./pkg/spec -run TestSchemaUpToDate -update

##@ Tools (built once per machine into RAYDROP_CACHE)

.PHONY: tools
tools: $(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/etcd $(FAKE_GCS) $(KUEUE_DIR)/kueue $(KUEUE_METRICS_CERTS) ## etcd, kube-apiserver, fake-gcs-server and Kueue for the tests and the local cloud

$(KUBE_BIN)/kube-apiserver:
	@mkdir -p $(KUBE_BIN)
	@echo "tools: building kube-apiserver $(KUBE_VERSION) (first time on this machine: about 5 minutes)"
	cd infra/tools/kube && $(GO) build -trimpath -ldflags="$(KUBE_LDFLAGS)" -o $@.tmp k8s.io/kubernetes/cmd/kube-apiserver
	@mv $@.tmp $@

$(KUBE_BIN)/etcd:
	@mkdir -p $(KUBE_BIN)
	@echo "tools: building etcd $(ETCD_VERSION) (first time on this machine: about 2 minutes)"
	cd infra/tools/etcd && $(GO) build -trimpath -ldflags=-s -o $@.tmp go.etcd.io/etcd/server/v3
	@mv $@.tmp $@

$(KUEUE_DIR)/kueue:
	@mkdir -p $(KUEUE_DIR)
	@echo "tools: building Kueue $(KUEUE_VERSION) (first time on this machine: about 5 minutes)"
	cd infra/tools/kueue && $(GO) build -trimpath -ldflags=-s -o $@.tmp sigs.k8s.io/kueue/cmd/kueue
	rm -rf $(KUEUE_DIR)/config && mkdir -p $(KUEUE_DIR)/config/crd $(KUEUE_DIR)/config/webhook
	src=$$(cd infra/tools/kueue && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/kueue) && \
	  cp $$src/config/components/crd/bases/*.yaml $(KUEUE_DIR)/config/crd/ && \
	  cp $$src/config/components/webhook/manifests.yaml $(KUEUE_DIR)/config/webhook/
	@mv $@.tmp $@

$(KUEUE_METRICS_CERTS):
	@echo "tools: creating $@, where Kueue $(KUEUE_VERSION) reads its metrics certificate (once per machine)"
	$(SUDO) install -d -o $$(id -u) $@

$(FAKE_GCS):
	@mkdir -p $(dir $@)
	@echo "tools: building fake-gcs-server $(FAKE_GCS_VERSION) with the local cloud's store (first time on this machine: about a minute)"
	cd infra/tools/fakegcs && GO=$(GO) ./build.sh $@.tmp
	@mv $@.tmp $@

# fake-gcs-server's own tests of its stores and HTTP server, against the local
# cloud's store: once per build of it (the marker is keyed as the binary is),
# by make test; make run uses the binary without waiting for them.
$(FAKE_GCS_TESTED): $(FAKE_GCS)
	@echo "tools: testing fake-gcs-server $(FAKE_GCS_VERSION) with the local cloud's store (once per build)"
	cd infra/tools/fakegcs && GO=$(GO) ./build.sh --test
	@touch $@

$(CHROMIUM):
	@echo "tools: installing Debian's chromium for the report's browser test (first time on this machine: about a minute)"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
	$@ --version

.PHONY: fakegcs-test
fakegcs-test: ## fake-gcs-server's own tests against the local cloud's indexed store (make test runs them once per build of the store)
	cd infra/tools/fakegcs && GO=$(GO) ./build.sh --test

$(GOLANGCI):
	@mkdir -p $(dir $@)
	@echo "tools: building golangci-lint $(GOLANGCI_VERSION) (first time on this machine: a few minutes)"
	GOBIN=$(dir $@).golangci-tmp $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)
	@mv $(dir $@).golangci-tmp/golangci-lint $@ && rmdir $(dir $@).golangci-tmp

include trainer/trainer.mk
include infra/gcp/gcp.mk
