# trainer.mk: the Python trainer's virtualenv, tests and GPU benchmark.
# Included by the root Makefile; every path here is derived from this file's
# location, so it also works as `make -f trainer/trainer.mk <target>`.

RAYDROP_CACHE ?= $(HOME)/.cache/raydrop
TRAINER_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
TRAINER_PYTHON ?= python3
# uv installs the pinned wheels several times faster than pip (parallel
# downloads, hard links from its cache); it is itself pinned and installed
# from PyPI into the virtualenv being built.
TRAINER_UV_VERSION ?= 0.8.13
TRAINER_REQS := $(TRAINER_DIR)/requirements.txt $(TRAINER_DIR)/requirements-test.txt
# The virtualenv lives outside the repository and is named by the hash of what
# goes into it, so every clone on the machine shares it and a change of pins
# (or of interpreter) builds a new one instead of mutating a shared one.
TRAINER_VENV_HASH := $(shell { cat $(TRAINER_REQS); $(TRAINER_PYTHON) -c 'import sys; print(sys.version)'; echo uv=$(TRAINER_UV_VERSION); } | sha256sum | cut -c1-12)
TRAINER_VENV ?= $(RAYDROP_CACHE)/trainer-venv-$(TRAINER_VENV_HASH)
TRAINER_BENCH_ARGS ?=

##@ Trainer (Python)

.PHONY: trainer-venv trainer-test trainer-bench

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
	echo "trainer-venv: installing uv $(TRAINER_UV_VERSION)"; \
	"$$tmp/bin/python" -m pip install --quiet --disable-pip-version-check uv==$(TRAINER_UV_VERSION); \
	echo "trainer-venv: installing $(TRAINER_REQS)"; \
	SSL_CERT_FILE="$${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" \
	UV_CACHE_DIR='$(RAYDROP_CACHE)/uv' \
	"$$tmp/bin/python" -m uv pip install --python "$$tmp/bin/python" $(foreach r,$(TRAINER_REQS),-r $(r)); \
	"$$tmp/bin/python" -c 'import torch, ray.train, transformers, trl, peft; print("trainer-venv: torch", torch.__version__, "ray", ray.__version__)'; \
	touch "$$tmp/.complete"; \
	if mv -T "$$tmp" "$$venv" 2>/dev/null; then :; \
	elif [ -f "$$venv/.complete" ]; then echo "trainer-venv: another build finished first; using it"; \
	else rm -rf "$$venv"; mv -T "$$tmp" "$$venv"; fi; \
	echo "trainer-venv: built in $$(( $$(date +%s) - start )) s"

trainer-test: trainer-venv ## Run the trainer's tests on CPU, offline (RAYDROP_LAYOUT_DIR=dir keeps the Ray Train layout)
	cd $(TRAINER_DIR) && PYTHONDONTWRITEBYTECODE=1 $(TRAINER_VENV)/bin/python -m pytest -p no:cacheprovider -q tests

trainer-bench: trainer-venv ## GPU benchmark: tokens/s and MFU, tutorial setup vs raydrop default (needs one CUDA GPU)
	cd $(TRAINER_DIR) && PYTHONDONTWRITEBYTECODE=1 $(TRAINER_VENV)/bin/python bench/bench.py $(TRAINER_BENCH_ARGS)
