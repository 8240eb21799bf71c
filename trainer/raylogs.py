"""Ray's own logs of one node, kept beside the run before the node goes.

Each Ray node writes its logs under /tmp/ray/session_latest/logs: every worker process's
output (worker-<id>-<job>-<pid>.out|err: a rank's whole output, which reaches the driver
only deduplicated), raylet.out|err, gcs_server.* on the head, dashboard*,
runtime_env_agent.*, python-core-worker-*.log. They live on the node's disk and go with
the pod when the workers are scaled down or the node is reclaimed. This collector runs
beside Ray on the node and copies the folder to a destination folder (a gs:// URI on the
cluster, a local path in tests) every `every` seconds, and once more when it is asked to
stop (SIGTERM, as the kubelet sends a container before a pod goes), so nothing depends on
reaching a dying pod afterwards.

- Each copy writes only the files that changed since the last one (by size and
  modification time); the others stay as they are.
- Ray's logs do not rotate, so a file is kept by its last `cap` bytes (8 MiB by
  default). `index.json` beside the files says, per file, how long it was, how much was
  kept, and whether it was cut.
- A copy that fails is reported on standard error and tried again next time; it never
  stops the collector, and the collector never touches Ray.

    python raylogs.py --logs /tmp/ray/session_latest/logs --dest gs://b/p/run/evidence/ray/POD
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

import result

DEFAULT_LOGS = "/tmp/ray/session_latest/logs"
DEFAULT_EVERY = 5.0
DEFAULT_CAP = 8 << 20
INDEX = "index.json"


class Collector:
    """Copies a Ray log folder to a destination folder, file by file, the changed ones."""

    def __init__(self, logs: str, dest: str, cap: int = DEFAULT_CAP) -> None:
        if cap <= 0:
            raise ValueError(f"cap {cap}: must be a positive number of bytes")
        self.logs = logs
        self.dest = result.normalize_storage_path(dest)
        self.cap = cap
        self._fs, self._base = result.filesystem(self.dest)
        self._seen: Dict[str, Tuple[int, int]] = {}  # file -> (size, mtime_ns) copied
        self._index: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _files(self):
        """Every regular file under the log folder, as (path relative to it, stat)."""
        for root, dirs, files in os.walk(self.logs):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # removed meanwhile
                if os.path.isfile(path):
                    yield os.path.relpath(path, self.logs), path, st

    def _tail(self, path: str, size: int) -> bytes:
        with open(path, "rb") as f:
            if size > self.cap:
                f.seek(size - self.cap)
            return f.read(self.cap)

    def _put(self, name: str, data: bytes) -> None:
        target = result.join(self._base, *name.split(os.sep))
        parent = target.rsplit("/", 1)[0] if "/" in target else ""
        if parent:
            self._fs.create_dir(parent, recursive=True)
        with self._fs.open_output_stream(target) as out:
            out.write(data)

    def sync(self) -> Tuple[int, Optional[str]]:
        """Copies what changed; returns how many files were written, and the first
        error met (None when every copy went through)."""
        with self._lock:
            written, first_error = 0, None
            if not os.path.isdir(self.logs):
                return 0, f"{self.logs} is not a folder (Ray has not started on this node?)"
            for rel, path, st in self._files():
                key = (st.st_size, st.st_mtime_ns)
                if self._seen.get(rel) == key:
                    continue
                try:
                    data = self._tail(path, st.st_size)
                    self._put(rel, data)
                except Exception as exc:  # noqa: BLE001 - reported, tried again next time
                    first_error = first_error or f"copy {rel}: {exc}"
                    continue
                self._seen[rel] = key
                self._index[rel] = {"bytes": st.st_size, "kept": len(data), "capped": st.st_size > len(data)}
                written += 1
            if written:
                try:
                    self._put(INDEX, json.dumps({"logs": self.logs, "cap": self.cap, "copiedAt": time.time(),
                                                 "files": self._index}, indent=2, sort_keys=True).encode())
                except Exception as exc:  # noqa: BLE001
                    first_error = first_error or f"copy {INDEX}: {exc}"
            return written, first_error

    def run(self, stop: threading.Event, every: float = DEFAULT_EVERY) -> None:
        """Copies every `every` seconds until stop is set, then once more."""
        while True:
            _, err = self.sync()
            if err:
                print(f"raylogs: {err}", file=sys.stderr, flush=True)
            if stop.wait(every):
                break
        _, err = self.sync()
        if err:
            print(f"raylogs: last copy: {err}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Copy this node's Ray logs beside the run, every few seconds and on SIGTERM.")
    p.add_argument("--logs", default=DEFAULT_LOGS, help="the node's Ray log folder")
    p.add_argument("--dest", required=True, help="where to copy it: gs://bucket/path, or a local folder")
    p.add_argument("--every", type=float, default=DEFAULT_EVERY, help="seconds between copies")
    p.add_argument("--cap", type=int, default=DEFAULT_CAP, help="bytes kept of each file, the last")
    args = p.parse_args(argv)
    if args.every <= 0:
        p.error(f"--every {args.every}: must be a positive number of seconds")
    try:
        collector = Collector(args.logs, args.dest, args.cap)
    except ValueError as exc:
        p.error(str(exc))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    collector.run(stop, args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
