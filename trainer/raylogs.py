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

On the cluster it runs as each Ray pod's `raylogs` sidecar, which shares /tmp/ray with
the Ray container (pkg/manifests). A RayCluster outlives the runs it serves, so the
sidecar follows the head's jobs (`--follow`, Ray's Jobs API, GET /api/jobs/): the latest
submitted job names its attempt's evidence folder in its runtime env
(RAYDROP_EVIDENCE), and the node's logs written since that job started go to
`<evidence folder>ray/<pod>/`. A job that names none (not one of raydrop's) gets no
copy; an ended job's folder gets the logs written for `linger` seconds after its end
(the workers' last words, the raylet's account of their exit), then nothing until the
next job starts. When the head cannot be reached, the copies go on to the last folder.

    python raylogs.py --logs /tmp/ray/session_latest/logs --dest gs://b/p/run/evidence/attempt-1/ray/POD
    python raylogs.py --follow http://HEAD:8265 --pod POD
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

import result

DEFAULT_LOGS = "/tmp/ray/session_latest/logs"
DEFAULT_EVERY = 5.0
DEFAULT_CAP = 8 << 20
DEFAULT_LINGER = 300.0
INDEX = "index.json"
# The runtime env variable in which a raydrop job names its attempt's evidence folder
# (gs://…/evidence/attempt-<n>/; pkg/manifests RuntimeEnvYAML).
EVIDENCE_ENV = "RAYDROP_EVIDENCE"
RAY_FOLDER = "ray"


class Collector:
    """Copies a Ray log folder to a destination folder, file by file, the changed ones."""

    def __init__(self, logs: str, dest: str, cap: int = DEFAULT_CAP, since: float = 0.0) -> None:
        """since: files last written before this time (seconds since the epoch) are
        another job's and are left out."""
        if cap <= 0:
            raise ValueError(f"cap {cap}: must be a positive number of bytes")
        self.logs = logs
        self.dest = result.normalize_storage_path(dest)
        self.cap = cap
        self._since_ns = int(since * 1e9)
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
                if self._seen.get(rel) == key or st.st_mtime_ns < self._since_ns:
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
        _every(self.sync, self.sync, stop, every)


def _every(copy: Callable[[], Tuple[int, Optional[str]]], last: Callable[[], Tuple[int, Optional[str]]],
           stop: threading.Event, every: float) -> None:
    """Calls copy every `every` seconds until stop is set, then last; reports their
    errors on standard error."""
    while True:
        _, err = copy()
        if err:
            print(f"raylogs: {err}", file=sys.stderr, flush=True)
        if stop.wait(every):
            break
    _, err = last()
    if err:
        print(f"raylogs: last copy: {err}", file=sys.stderr, flush=True)


def latest_job(jobs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The latest started of the submitted jobs in a GET /api/jobs/ answer (Ray's
    JobDetails), or None when there is none."""
    submitted = [j for j in jobs if j.get("type") == "SUBMISSION" and j.get("start_time") is not None]
    return max(submitted, key=lambda j: j["start_time"], default=None)


def evidence_of(job: Dict[str, Any]) -> Optional[str]:
    """The attempt's evidence folder a job names in its runtime env, or None."""
    folder = ((job.get("runtime_env") or {}).get("env_vars") or {}).get(EVIDENCE_ENV)
    return folder if isinstance(folder, str) and folder.startswith(("gs://", "/")) else None


def http_jobs(url: str, timeout: float = 10.0) -> List[Dict[str, Any]]:
    """Ray's Jobs API answer to GET <url>/api/jobs/."""
    with urllib.request.urlopen(url.rstrip("/") + "/api/jobs/", timeout=timeout) as r:
        jobs = json.load(r)
    if not isinstance(jobs, list):
        raise ValueError(f"GET {url}/api/jobs/ answered {type(jobs).__name__}, not a list of jobs")
    return jobs


class Follower:
    """Copies a node's Ray logs to the evidence folder of the head's latest job."""

    def __init__(self, logs: str, pod: str, jobs: Callable[[], List[Dict[str, Any]]], cap: int = DEFAULT_CAP,
                 linger: float = DEFAULT_LINGER, now: Callable[[], float] = time.time) -> None:
        if cap <= 0:
            raise ValueError(f"cap {cap}: must be a positive number of bytes")
        if linger < 0:
            raise ValueError(f"linger {linger}: must be zero or a positive number of seconds")
        if not pod or "/" in pod:
            raise ValueError(f"pod {pod!r}: must be the pod's name")
        self.logs, self.pod, self.cap, self.linger = logs, pod, cap, linger
        self._jobs, self._now = jobs, now
        self._job: Optional[Dict[str, Any]] = None
        self.collector: Optional[Collector] = None

    def _follow(self) -> Optional[str]:
        """Picks the latest job up; returns the error met asking for it, if any."""
        try:
            job = latest_job(self._jobs())
        except Exception as exc:  # noqa: BLE001 - the head may be gone: keep the last folder
            return f"ask the head for its jobs: {exc}"
        if job is None:
            return None
        if self._job is None or job.get("submission_id") != self._job.get("submission_id"):
            folder = evidence_of(job)
            self.collector = None
            if folder:
                dest = result.join(folder.rstrip("/"), RAY_FOLDER, self.pod)
                self.collector = Collector(self.logs, dest, self.cap, since=job["start_time"] / 1000.0)
        self._job = job
        return None

    def _active(self) -> bool:
        if self.collector is None or self._job is None:
            return False
        end = self._job.get("end_time")
        return end is None or self._now() - end / 1000.0 <= self.linger

    def sync(self, ask: bool = True) -> Tuple[int, Optional[str]]:
        """Asks the head for its latest job (unless ask is False), then copies what
        changed to that job's folder while it runs and for `linger` seconds after."""
        err = self._follow() if ask else None
        if not self._active():
            return 0, err
        written, copy_err = self.collector.sync()
        return written, err or copy_err

    def run(self, stop: threading.Event, every: float = DEFAULT_EVERY) -> None:
        """Copies every `every` seconds until stop is set, then once more (without
        asking the head, which may be going too)."""
        _every(self.sync, lambda: self.sync(ask=False), stop, every)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Copy this node's Ray logs beside the run, every few seconds and on SIGTERM.")
    p.add_argument("--logs", default=DEFAULT_LOGS, help="the node's Ray log folder")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--dest", help="where to copy it: gs://bucket/path, or a local folder")
    where.add_argument("--follow", metavar="URL",
                       help="the head's dashboard (http://HEAD:8265): copy to the evidence folder its latest job names")
    p.add_argument("--pod", help="this pod's name (with --follow: the folder under the evidence's ray/)")
    p.add_argument("--every", type=float, default=DEFAULT_EVERY, help="seconds between copies")
    p.add_argument("--cap", type=int, default=DEFAULT_CAP, help="bytes kept of each file, the last")
    p.add_argument("--linger", type=float, default=DEFAULT_LINGER,
                   help="with --follow: seconds after a job's end that its folder still gets the node's logs")
    args = p.parse_args(argv)
    if args.every <= 0:
        p.error(f"--every {args.every}: must be a positive number of seconds")
    if args.follow and not args.pod:
        p.error("--follow needs --pod, this pod's name")
    try:
        if args.follow:
            url = args.follow
            collector = Follower(args.logs, args.pod, lambda: http_jobs(url), args.cap, args.linger)
        else:
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
