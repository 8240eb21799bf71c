#!/usr/bin/env bash
# install.sh PYTHON: installs the trainer's locked dependencies
# (requirements.lock, every package pinned with its hashes) into PYTHON's
# environment with the pinned uv (uv.lock.txt, itself hash-checked), checks
# that the environment is consistent, and imports the trainer's stack.
# The trainer image runs it on the Ray image's Python (Dockerfile), the
# trainer's test virtualenv on its own (make trainer-venv): one script, so
# the tests run on what the image holds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$1
echo "install.sh: uv from uv.lock.txt into $py"
"$py" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$here/uv.lock.txt"
echo "install.sh: $(grep -c '^[a-z0-9]' "$here/requirements.lock") packages from requirements.lock"
# --python names the environment: the Ray image's Python is not a virtualenv.
# Bytecode is compiled once here: a Ray worker imports about 3,500 modules
# (torch, transformers, TRL, PEFT, datasets), 5 s of CPU with it and 13 s
# without, in every process of every run.
"$py" -m uv pip install --python "$py" --require-hashes --compile-bytecode -r "$here/requirements.lock"
"$py" -m uv pip check --python "$py"
"$py" -c 'import torch, torchvision, ray.train, transformers, datasets, accelerate, trl, peft; print("install.sh: torch", torch.__version__, "ray", ray.__version__, "transformers", transformers.__version__)'
