#!/usr/bin/env bash
# lock.sh UV_PYTHON: writes requirements.lock (every package the trainer's
# requirements.txt needs, pinned with its hashes, for the trainer image's
# Python on Linux x86_64) and uv.lock.txt (the pinned uv that installs it),
# with `python -m uv` from UV_PYTHON's environment. Run by `make trainer-lock`;
# the files are checked in, and a test (trainer/image_test.go) fails when
# requirements.txt or the image's Dockerfile moves without them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$1
uv_version=$(sed -n 's/^uv==\([0-9.]*\).*/\1/p' "$here/uv.in")
python_version=$(sed -n 's/^FROM .*-py\([0-9]\)\([0-9]*\)-gpu.*/\1.\2/p' "$here/Dockerfile")
[ -n "$uv_version" ] && [ -n "$python_version" ] || { echo "lock.sh: cannot read uv's pin (uv.in) or the image's Python (Dockerfile)" >&2; exit 1; }
"$py" -m uv --version | grep -qx "uv $uv_version" || { echo "lock.sh: $py has $("$py" -m uv --version), uv.in pins $uv_version" >&2; exit 1; }
compile() { # in out
	"$py" -m uv pip compile --quiet --generate-hashes --no-annotate \
		--python-version "$python_version" --python-platform x86_64-manylinux_2_28 \
		--custom-compile-command "make trainer-lock" -o "$2" "$1"
	# The input's hash, on the first line: the test compares it with the input.
	{ echo "# from $(basename "$1") sha256:$(sha256sum <"$1" | cut -d' ' -f1), Python $python_version, Linux x86_64"; cat "$2"; } >"$2.tmp" && mv "$2.tmp" "$2"
}
compile "$here/../requirements.txt" "$here/requirements.lock"
compile "$here/uv.in" "$here/uv.lock.txt"
echo "lock.sh: $(grep -c '^[a-z0-9]' "$here/requirements.lock") packages in requirements.lock, uv $uv_version in uv.lock.txt, for Python $python_version"
