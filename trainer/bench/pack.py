"""Prepares what the GPU benchmark carries to an offline GPU machine, and prints the command to run there.

The machine has PyTorch, transformers 5.x, accelerate and PEFT, but not the
trainer's pinned stack, bitsandbytes, TRL, Ray or datasets, and no network.
This downloads, for Linux x86-64 and CPython 3.12, the wheels that make the
pinned stack import there (--no-deps):

* transformers, PEFT and accelerate as pinned in requirements.txt;
* tokenizers and huggingface-hub in the ranges transformers 4.55.2 checks
  at import (>=0.21,<0.22 and >=0.34,<1.0): the machine's 5.x stack has
  newer ones;
* requests and its dependencies: transformers 4.55.2 checks for requests at
  import and huggingface-hub 0.x uses it; the 5.x stack does not need it;
* bitsandbytes cut to the CUDA libraries a machine's torch can load: the
  pinned 0.47.0 keeps its CUDA 12.8 and 12.9 builds; for a CUDA 13 torch
  (PyPI's torch 2.11 wheels are built for CUDA 13), 0.47.0 has no build, so
  0.50.2 keeps its CUDA 13.0 and 13.2 ones. Each keeps its CPU library.

Downloads and cuts are cached under RAYDROP_CACHE in a folder named by the
hash of the pins and of this file. The pack (default .build/gpu-bench/,
git-ignored) is then filled with hard links or copies; it must stay under
64 MiB, or this fails.

    python bench/pack.py [--dest DIR]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, List, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(TRAINER_DIR)

LIMIT = 64 * 2 ** 20
PINNED = ("transformers", "peft", "accelerate")
# Resolved as in the trainer's virtualenv, inside what transformers 4.55.2 checks at import.
EXTRA = ("tokenizers==0.21.4", "huggingface-hub==0.36.2", "requests==2.34.2", "urllib3==2.8.0",
         "certifi==2026.10.19.post1", "idna==3.20")
# Pure-Python builds only, so the same wheels install on the CPU dry run's interpreter too
# (charset-normalizer also publishes compiled ones, per Python version).
PURE = ("charset-normalizer==3.5.3",)
# bitsandbytes version -> CUDA libraries kept (torch.version.cuda without the dot).
BNB_CUTS = {"pin": ("128", "129"), "0.50.2": ("130", "132")}
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_24_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64"]


def pins(requirements: str) -> Dict[str, str]:
    out = {}
    with open(requirements, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line.strip())
            if m:
                out[m.group(1).lower()] = m.group(2)
    return out


def requirements_list(p: Dict[str, str]) -> List[str]:
    return [f"{n}=={p[n]}" for n in PINNED] + list(EXTRA)


def bnb_versions(p: Dict[str, str]) -> Dict[str, Sequence[str]]:
    return {(p["bitsandbytes"] if k == "pin" else k): v for k, v in BNB_CUTS.items()}


def cache_key(reqs: Sequence[str], bnb: Dict[str, Sequence[str]]) -> str:
    h = hashlib.sha256()
    h.update(repr((list(reqs), PURE, sorted((k, list(v)) for k, v in bnb.items()))).encode())
    with open(__file__, "rb") as f:
        h.update(f.read())
    return h.hexdigest()[:12]


def download(dest: str, reqs: Sequence[str], platform: Sequence[str] = PLATFORM) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", *platform, "--dest", dest, *reqs]
    print("pack: pip download " + " ".join(reqs), flush=True)
    subprocess.run(cmd, check=True)


def cut_wheel(src: str, dest_dir: str, keep: Sequence[str]) -> str:
    """A copy of a bitsandbytes wheel with only the CPU and the given CUDA libraries (RECORD rewritten)."""
    wanted = {f"libbitsandbytes_cuda{c}.so" for c in keep} | {"libbitsandbytes_cpu.so"}
    dest = os.path.join(dest_dir, os.path.basename(src))
    found = set()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        dropped = set()
        for info in zin.infolist():
            base = os.path.basename(info.filename)
            if base.startswith("libbitsandbytes_") and base not in wanted:
                dropped.add(info.filename)
                continue
            if base in wanted:
                found.add(base)
            if info.filename == record_name:
                continue
            zout.writestr(info, zin.read(info.filename), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        lines = [line for line in zin.read(record_name).decode().splitlines()
                 if line and line.split(",")[0] not in dropped]
        zout.writestr(record_name, "\n".join(lines) + "\n")
    missing = wanted - found
    if missing:
        raise SystemExit(f"pack: {os.path.basename(src)} has no {sorted(missing)}")
    return dest


def sha256_b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_cache(cache: str, reqs: Sequence[str], bnb: Dict[str, Sequence[str]]) -> str:
    """The cached folder of wheels (wheels/ and bnb-<version>/), built once."""
    key = cache_key(reqs, bnb)
    folder = os.path.join(cache, f"gpu-bench-wheels-{key}")
    if os.path.exists(os.path.join(folder, ".complete")):
        print(f"pack: cached wheels {folder}")
        return folder
    os.makedirs(cache, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"gpu-bench-wheels-{key}.tmp-", dir=cache)
    try:
        os.makedirs(os.path.join(tmp, "wheels"))
        download(os.path.join(tmp, "wheels"), reqs)
        download(os.path.join(tmp, "wheels"), PURE,
                 ["--python-version", "3.12", "--implementation", "py", "--abi", "none", "--platform", "any"])
        raw = os.path.join(tmp, "raw")
        os.makedirs(raw)
        for version in bnb:  # one at a time: pip resolves one version of a name per call
            download(raw, [f"bitsandbytes=={version}"])
        for version, keep in bnb.items():
            (src,) = [os.path.join(raw, n) for n in os.listdir(raw) if n.startswith(f"bitsandbytes-{version}-")]
            out = os.path.join(tmp, f"bnb-{version}")
            os.makedirs(out)
            cut_wheel(src, out, keep)
        shutil.rmtree(raw)
        open(os.path.join(tmp, ".complete"), "w").close()
        try:
            os.rename(tmp, folder)
        except OSError:  # another pack finished first
            if not os.path.exists(os.path.join(folder, ".complete")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"pack: wheels cached in {folder}")
    return folder


def fill(dest: str, cached: str) -> int:
    """Links (or copies) the cached wheels into dest; returns the bytes."""
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    total = 0
    for root, _, files in os.walk(cached):
        for name in files:
            if not name.endswith(".whl"):
                continue
            src = os.path.join(root, name)
            out = os.path.join(dest, os.path.relpath(src, cached))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            try:
                os.link(src, out)
            except OSError:
                shutil.copy2(src, out)
            total += os.path.getsize(out)
    return total


def working_tree_bytes() -> int:
    """Tracked plus untracked-but-not-ignored files: what travels besides the carried paths."""
    try:
        names = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "-co", "--exclude-standard"], check=True,
                               capture_output=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return -1
    total = 0
    for n in names:
        path = os.path.join(REPO, n.decode())
        if n and os.path.isfile(path):
            total += os.path.getsize(path)
    return total


def mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", default=os.path.join(REPO, ".build", "gpu-bench"), help="the pack folder")
    p.add_argument("--cache", default=os.environ.get("RAYDROP_CACHE",
                                                     os.path.join(os.path.expanduser("~"), ".cache", "raydrop")))
    args = p.parse_args(argv)
    pinned = pins(os.path.join(TRAINER_DIR, "requirements.txt"))
    reqs = requirements_list(pinned)
    bnb = bnb_versions(pinned)
    cached = build_cache(args.cache, reqs, bnb)
    total = fill(args.dest, cached)
    for root, _, files in sorted(os.walk(args.dest)):
        for name in sorted(files):
            path = os.path.join(root, name)
            print(f"  {mib(os.path.getsize(path)):>10}  {os.path.relpath(path, REPO)}")
    tree = working_tree_bytes()
    print(f"pack: {os.path.relpath(args.dest, REPO)} holds {total:,} bytes ({mib(total)}; limit 64 MiB); "
          f"the working tree that travels with it {mib(tree) if tree >= 0 else 'unknown (no git)'}")
    if total >= LIMIT:
        print("pack: over 64 MiB", file=sys.stderr)
        return 1
    rel = os.path.relpath(args.dest, REPO)
    print("\nOn the GPU machine, from the repository root, with the working tree and "
          f"{rel} carried (a git-ignored path: carry [\"{rel}\"]):\n")
    print("    bash trainer/bench/gpu-run.sh\n")
    print("It installs the wheels into /tmp/site, runs every setup (about 7 minutes on one H200; training stops at 390 s "
          "and setups not started are skipped) and writes bench-result.json and bench-table.txt into $OUT (else "
          f"{rel}/out).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
