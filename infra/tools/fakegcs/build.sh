#!/usr/bin/env bash
# build.sh OUT: builds fake-gcs-server, the local cloud's Cloud Storage
# emulator, at the version go.mod pins, with backend/memory.go (an indexed
# in-memory store, see that file for why) in place of the release's
# internal/backend/memory.go. The release's source is copied from the Go
# module cache into a temporary folder and built there; nothing else of it
# changes.
# build.sh --test: runs fake-gcs-server's own tests of its stores and of its
# HTTP server against that source instead.
# Run from infra/tools/fakegcs.
set -euo pipefail
GO=${GO:-go}
dir=$($GO mod download -json github.com/fsouza/fake-gcs-server | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [[ -z "$dir" || ! -f "$dir/internal/backend/memory.go" ]]; then
	echo "build.sh: fake-gcs-server's internal/backend/memory.go not found (module folder: '$dir')" >&2
	exit 1
fi
work=$(mktemp -d)
trap 'chmod -R u+w "$work" && rm -rf "$work"' EXIT
cp -R "$dir" "$work/src"
chmod -R u+w "$work/src"
cp backend/memory.go "$work/src/internal/backend/memory.go"
if [[ "$1" == --test ]]; then
	(cd "$work/src" && $GO test -count=1 ./internal/backend ./fakestorage)
	exit
fi
cp go.mod "$work/build.mod"
cp go.sum "$work/build.sum"
$GO mod edit -modfile="$work/build.mod" -replace "github.com/fsouza/fake-gcs-server=$work/src"
$GO build -modfile="$work/build.mod" -trimpath -ldflags=-s -o "$1" github.com/fsouza/fake-gcs-server
