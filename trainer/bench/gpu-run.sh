#!/usr/bin/env bash
# The GPU benchmark in one command, for a machine with PyTorch but no network,
# given the pack that `make gpu-bench-pack` prepares (bench/pack.py).
#
#   bash trainer/bench/gpu-run.sh [bench.py options]      # from the repository root
#
# It installs the carried wheels into a clean folder (the pinned transformers
# stack, and the bitsandbytes cut whose CUDA library matches this torch),
# checks that they import, and runs bench/bench.py with every setup, printing
# each setup's figures as it finishes. If the pinned stack does not import
# here, the machine's own versions run, with the reason in the result. It
# writes bench-result.json, bench-table.txt and bench-log.txt into $OUT (else
# <pack>/out). `make gpu-bench-dry-run` runs this same script with --dry-run
# on CPU.
#
# Environment: RAYDROP_BENCH_PACK (default .build/gpu-bench), RAYDROP_BENCH_SITE
# (the install folder, emptied first; default /tmp/site), RAYDROP_BENCH_PYTHON
# (default python3).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pack=${RAYDROP_BENCH_PACK:-$root/.build/gpu-bench}
site=${RAYDROP_BENCH_SITE:-/tmp/site}
py=${RAYDROP_BENCH_PYTHON:-python3}
out=${OUT:-$pack/out}
start=$EPOCHREALTIME
phase() { awk -v a="$start" -v b="$EPOCHREALTIME" -v m="$1" 'BEGIN { printf "gpu-run: %-34s at %6.1f s\n", m, b - a }'; }

mkdir -p "$out" || exit 1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONDONTWRITEBYTECODE=1
[ -d "$pack/wheels" ] || { echo "gpu-run: no $pack/wheels: run make gpu-bench-pack and carry the folder" >&2; exit 2; }

# The machine's interpreter and torch; the CUDA build decides which bitsandbytes library can load.
read -r pyver torchver cuda < <("$py" -c 'import platform, torch
print(platform.python_version(), torch.__version__, (torch.version.cuda or "none").replace(".", ""))') \
  || { echo "gpu-run: $py cannot import torch" >&2; exit 2; }
echo "gpu-run: python $pyver, torch $torchver, CUDA build $cuda (the wheels are py3 or abi3: any CPython >= 3.9)"
bnb=""
for w in "$pack"/bnb-*/bitsandbytes-*.whl; do
  [ -f "$w" ] || continue
  if "$py" -c 'import sys, zipfile; sys.exit(0 if f"bitsandbytes/libbitsandbytes_cuda{sys.argv[2]}.so" in zipfile.ZipFile(sys.argv[1]).namelist() else 1)' "$w" "$cuda"; then
    bnb=$w
    break
  fi
done
if [ -n "$bnb" ]; then
  echo "gpu-run: bitsandbytes for CUDA $cuda: $(basename "$bnb")"
else
  echo "gpu-run: no carried bitsandbytes has a CUDA $cuda library: 4-bit setups fall back to bf16, labelled"
fi

rm -rf "$site" "$site-bnb"
if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$pack"/wheels/*.whl ${bnb:+"$bnb"}; then
  echo "gpu-run: pip could not install the carried wheels" >&2
  exit 2
fi
phase "wheels installed in $site"

check='import os, sys
import accelerate, huggingface_hub, peft, tokenizers, transformers
from transformers import Gemma3ForConditionalGeneration, Trainer
site = os.path.realpath(sys.argv[1])
for m in (accelerate, huggingface_hub, peft, tokenizers, transformers):
    if not os.path.realpath(m.__file__).startswith(site + os.sep):
        sys.exit(f"{m.__name__} {m.__version__} comes from {m.__file__}, not the carried wheels")
print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "huggingface_hub",
      huggingface_hub.__version__, "peft", peft.__version__, "accelerate", accelerate.__version__)'
if versions=$(PYTHONPATH="$site" "$py" -c "$check" "$site" 2>"$out/stack-check.txt"); then
  export PYTHONPATH="$site" RAYDROP_BENCH_STACK="carried wheels in $site: $versions"
else
  why=$(grep -v '^\s*$' "$out/stack-check.txt" | tail -n 1)
  echo "gpu-run: the pinned stack does not run here ($why); running with the machine's own versions" >&2
  export RAYDROP_BENCH_STACK="the machine's own (the carried pinned stack failed: $why)"
  if [ -n "$bnb" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site-bnb" "$bnb" \
      && export PYTHONPATH="$site-bnb"
  fi
fi
phase "stack checked"
echo "gpu-run: stack: $RAYDROP_BENCH_STACK"

cd "$root/trainer" || exit 2
"$py" -u bench/bench.py --trainer transformers --out "$out" "$@" 2>&1 | tee "$out/bench-log.txt"
status=${PIPESTATUS[0]}
phase "benchmark finished (exit $status)"
echo "gpu-run: $out/bench-result.json, $out/bench-table.txt, $out/bench-log.txt"
exit "$status"
