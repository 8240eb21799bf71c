"""Model weights staged once in the deployment's bucket and copied once per node.

The pipeline picks, per run, a staged-model URI (gs://<bucket>/models/<repo id>/<commit>)
and the one run that stages it (the locking is the pipeline's). That run's driver
streams the Hub snapshot into the URI (stage); the driver of every other run waits for it
(await_staged); on every node one Ray Train worker copies it onto the node's scratch disk
and the node's other workers load that copy (fetch_to_node). The Hub is read once per
deployment and model, the bucket once per node, and no Hub outage or rate limit stops a
node from starting.

The layout under the URI is a contract with the Go pipeline:

    <path>                   each model file at its repository-relative path
    raydrop-heartbeat.json   {"run", "at", "files", "bytes"}: rewritten while staging,
                             once at its start and at least every 30 s
    raydrop-staged.json      the marker, written last: {"repo", "commit", "files":
                             [{"path", "size"}], "stagedBy", "stagedAt", "seconds"}

Names starting with ``raydrop-`` are never model files.

Which files are staged (``model_files``): the files at the repository's root whose
suffix is one from_pretrained reads for a model and its processor (.json, .safetensors,
.model, .txt, .jinja, .tiktoken), and PyTorch's .bin weights only when the root has no
.safetensors. Folders (original/, onnx/, ...), READMEs, .gitattributes, GGUF, .pth and
custom code stay on the Hub: the trainer loads the root and never runs remote code.
"""

from __future__ import annotations

import fcntl
import json
import os
import posixpath
import re
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import result

MARKER = "raydrop-staged.json"
HEARTBEAT = "raydrop-heartbeat.json"
RESERVED_PREFIX = "raydrop-"
# Written in the node's copy once every file is there: a copy without it was cut short.
NODE_COMPLETE = "raydrop-node-copy.json"
# Beside the node's copy: locked while one process copies or checks it, and one JSON
# line per fetch (who, whether it copied, how long it took).
NODE_FETCHES_SUFFIX = ".fetches"
NODE_MODELS_DIR = "models"

MODEL_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja", ".tiktoken")
PICKLE_SUFFIX = ".bin"
# The contract asks for a heartbeat at least every 30 s; this leaves room for a slow write.
BEAT_S = 20.0
LOG_S = 30.0
WAIT_LOG_S = 60.0
CHUNK = 8 << 20
# Files copied at once: a shard streams at well under a node's or a bucket's bandwidth.
THREADS = 4
GIB = float(1 << 30)

# A Hub repository id's segments and a commit id: they name folders on the node.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

Log = Callable[[str], None]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _bucket(uri: str) -> Tuple[Any, str]:
    """(pyarrow filesystem, path within it) for a staged-model URI (gs://, file://) or a local path."""
    return result.filesystem(uri if result.is_uri(uri) else os.path.abspath(uri))


def _read_bytes(fs, path: str) -> Optional[bytes]:
    """The object's content, or None when there is none."""
    import pyarrow.fs

    if fs.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return None
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        return None  # removed between the two calls


def _read_json(fs, path: str) -> Optional[Dict[str, Any]]:
    raw = _read_bytes(fs, path)
    return None if raw is None else json.loads(raw.decode("utf-8"))


def model_files(entries: Sequence[Tuple[str, str, int]]) -> List[Tuple[str, int]]:
    """The (path, size) of the files to stage, sorted, out of a repository root's listing
    of (path, "file" or "directory", size); see the module's doc for the rule."""
    files = [(p, n) for p, kind, n in entries if kind == "file" and "/" not in p]
    files = [(p, n) for p, n in files if not p.startswith(RESERVED_PREFIX)]
    has_safetensors = any(p.endswith(".safetensors") for p, _ in files)
    keep = MODEL_SUFFIXES if has_safetensors else MODEL_SUFFIXES + (PICKLE_SUFFIX,)
    return sorted((p, n) for p, n in files if p.endswith(keep))


def _has_weights(files: Sequence[Tuple[str, int]]) -> bool:
    return any(p.endswith((".safetensors", PICKLE_SUFFIX)) for p, _ in files)


class _Progress:
    """What a copy has done so far. While it runs, a thread writes the heartbeat (if
    any) every BEAT_S and logs the progress at most every LOG_S."""

    def __init__(self, what: str, files: int, total: int, log: Log,
                 beat: Optional[Callable[[Dict[str, Any]], None]] = None) -> None:
        self.what, self.total_files, self.total, self.log, self.beat = what, files, total, log, beat
        self.files = 0
        self.bytes = 0
        self.start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raydrop-progress", daemon=True)

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    def file_done(self) -> None:
        with self._lock:
            self.files += 1

    def seconds(self) -> float:
        return time.monotonic() - self.start

    def summary(self) -> str:
        s = self.seconds()
        rate = self.bytes / (1 << 20) / s if s > 0 else 0.0
        return (f"{self.files}/{self.total_files} files, {self.bytes / GIB:.2f}/{self.total / GIB:.2f} GiB "
                f"in {s:.1f} s ({rate:.0f} MiB/s)")

    def __enter__(self) -> "_Progress":
        self._send_beat()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _send_beat(self) -> None:
        if self.beat is None:
            return
        with self._lock:
            doc = {"at": _now(), "files": self.files, "bytes": self.bytes}
        try:
            self.beat(doc)
        except Exception as exc:  # noqa: BLE001 - the copy goes on; a waiter may time out
            self.log(f"model: could not write the heartbeat: {result.error_text(exc)}")

    def _run(self) -> None:
        last_log = time.monotonic()
        while not self._stop.wait(BEAT_S):
            self._send_beat()
            if time.monotonic() - last_log >= LOG_S:
                last_log = time.monotonic()
                self.log(f"model: {self.what}: {self.summary()}")


def _each(items: Sequence[Any], fn: Callable[[Any], None]) -> None:
    """fn on every item, THREADS at a time; the first failure is raised once the
    copies already under way have ended, and the rest are not started."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(THREADS, len(items)))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _pump(read: Callable[[int], bytes], write: Callable[[bytes], Any], progress: _Progress) -> int:
    """Copy a stream CHUNK by CHUNK; returns the bytes copied."""
    copied = 0
    while True:
        chunk = read(CHUNK)
        if not chunk:
            return copied
        write(chunk)
        copied += len(chunk)
        progress.add(len(chunk))


# ---------------------------------------------------------------------------
# Staging: the Hub to the bucket, by the driver of the run that holds the lease.


def stage(model_id: str, commit: str, uri: str, run_id: str, log: Log,
          endpoint: Optional[str] = None) -> Dict[str, Any]:
    """Stream model_id's files at commit from the Hub into uri, then write the marker;
    returns the marker. Nothing is copied when the marker is there already (a redelivered
    job), nor a file already there at its listed size (a retry after a stager died:
    an object is only ever there whole). endpoint: the Hub's address (default HF_ENDPOINT);
    the token is HF_TOKEN's."""
    from huggingface_hub import HfFileSystem

    fs, base = _bucket(uri)
    marker_path = posixpath.join(base, MARKER)
    done = _read_json(fs, marker_path)
    if done is not None:
        log(f"model: {uri} is staged already (by {done.get('stagedBy')} at {done.get('stagedAt')}): nothing to copy")
        return done
    # HF_ENDPOINT is read here rather than at huggingface_hub's import, so that it
    # also applies to the file URLs, which huggingface_hub builds from its import-time
    # constant when given no endpoint.
    hub = HfFileSystem(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None)
    root = f"{model_id}@{commit}"
    files = model_files(_hub_listing(hub, root))
    if not _has_weights(files):
        raise ValueError(f"{root} has no .safetensors or .bin weights at its root (files staged from it: "
                         f"{[p for p, _ in files]}); from_pretrained could not load a copy of it")
    total = sum(n for _, n in files)
    log(f"model: staging {len(files)} files of {root} ({total / GIB:.2f} GiB) into {uri}")
    import pyarrow.fs

    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        fs.create_dir(base, recursive=True)
    beat_path = posixpath.join(base, HEARTBEAT)
    progress = _Progress(f"staging {uri}", len(files), total, log,
                         beat=lambda doc: result.put_json(fs, beat_path, {"run": run_id, **doc}))
    with progress:
        _each(files, lambda f: _hub_to_bucket(hub, root, f[0], f[1], fs, base, progress))
    marker = {
        "repo": model_id, "commit": commit, "files": [{"path": p, "size": n} for p, n in files],
        "stagedBy": run_id, "stagedAt": _now(), "seconds": round(progress.seconds(), 3),
    }
    result.put_json(fs, marker_path, marker)
    log(f"model: staged {progress.summary()}; wrote {MARKER}")
    return marker


def _hub_listing(hub, root: str) -> List[Tuple[str, str, int]]:
    """(path, type, size) of what is at the root of a repository revision (root: repo@commit)."""
    out = []
    for entry in hub.ls(root, detail=True):
        name = entry["name"]
        if not name.startswith(root + "/"):
            raise ValueError(f"the Hub listed {name!r} under {root!r}")
        out.append((name[len(root) + 1:], entry["type"], int(entry.get("size") or 0)))
    return out


def _hub_to_bucket(hub, root: str, path: str, size: int, fs, base: str, progress: _Progress) -> None:
    import pyarrow.fs

    dest = posixpath.join(base, path)
    there = fs.get_file_info(dest)
    if there.type == pyarrow.fs.FileType.File and there.size == size:
        progress.add(size)
        progress.file_done()
        return
    with hub.open(f"{root}/{path}", "rb", block_size=0) as src, fs.open_output_stream(dest) as dst:
        copied = _pump(src.read, dst.write, progress)
    if copied != size:
        raise OSError(f"{root}/{path}: the Hub sent {copied} bytes, its listing says {size}")
    progress.file_done()


def ready(args, log: Log) -> None:
    """With --staged-model, make sure the model is staged before anything loads it (the
    training driver before the workers start, the data check before it checks): this run
    stages it (--stage-model true), or waits for the run that does, and stages it itself
    if that run's heartbeat stays silent (await_staged). A failure here fails the job
    with its message, and the pipeline retries it."""
    if not getattr(args, "staged_model", ""):
        return
    start = time.monotonic()
    if not args.stage_model:
        log(f"waiting for the model to be staged at {args.staged_model}")
        if await_staged(args.staged_model, log) is not None:
            log(f"model staged at {args.staged_model}; waited {time.monotonic() - start:.1f} s")
            return
    stage(args.model_id, args.model_revision, args.staged_model, args.run_id, log)
    log(f"model staged at {args.staged_model} in {time.monotonic() - start:.1f} s")


# ---------------------------------------------------------------------------
# Waiting: the driver of a run that does not stage.


def await_staged(uri: str, log: Log, poll: float = 10.0, stale: float = 600.0) -> Optional[Dict[str, Any]]:
    """Wait until the marker is at uri; returns it. Returns None when for stale seconds
    neither the marker appeared nor the heartbeat changed: the run staging it stopped
    before its marker (or has not started copying, e.g. still waiting for its nodes), and
    the caller stages it itself rather than wait on. The copies are the same bytes, and a
    copy finds the files another left whole (stage)."""
    fs, base = _bucket(uri)
    marker_path, beat_path = posixpath.join(base, MARKER), posixpath.join(base, HEARTBEAT)
    start = last_change = last_log = time.monotonic()
    beat = _read_bytes(fs, beat_path)
    while True:
        marker = _read_json(fs, marker_path)
        if marker is not None:
            return marker
        now = time.monotonic()
        seen = _read_bytes(fs, beat_path)
        if seen != beat:
            beat, last_change = seen, now
        elif now - last_change >= stale:
            log(f"model: {uri} is not staged: no {MARKER} and no change to {HEARTBEAT} for {stale:.0f} s "
                f"(last heartbeat: {_beat_text(beat)}); the run staging it has stopped or not started, so this "
                f"run stages it")
            return None
        if now - last_log >= WAIT_LOG_S:
            last_log = now
            log(f"model: waiting {now - start:.0f} s for {uri} to be staged (last heartbeat: {_beat_text(beat)})")
        time.sleep(poll)


def _beat_text(raw: Optional[bytes]) -> str:
    if raw is None:
        return "none"
    return " ".join(raw.decode("utf-8", "replace").split())


# ---------------------------------------------------------------------------
# The node's copy: by every Ray Train worker; one process per node copies.


def node_dir(root: str, repo: str, commit: str) -> str:
    """Where a staged model is copied on a node: <root>/models/<repo id>/<commit>."""
    parts = repo.split("/") + [commit]
    if not all(_SEGMENT_RE.match(p) for p in parts):
        raise ValueError(f"{MARKER} names repo {repo!r} and commit {commit!r}: expected a Hub id "
                         "(owner/name, letters, digits, '.', '_', '-') and a commit id")
    return os.path.join(root, NODE_MODELS_DIR, *parts)


def fetch_to_node(uri: str, root: str, log: Log) -> str:
    """A folder on this node holding the model staged at uri (its marker must be there),
    copied under root (the node's scratch volume) by the first process of the node to
    get here; the others wait for that copy and use it. Returns the folder."""
    fs, base = _bucket(uri)
    marker = _read_json(fs, posixpath.join(base, MARKER))
    if marker is None:
        raise FileNotFoundError(f"no model staged at {uri}: {MARKER} is missing (the driver waits for it before "
                                "the workers start)")
    dest = node_dir(root, marker["repo"], marker["commit"])
    files = _marker_files(marker, uri)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    start = time.monotonic()
    with open(dest + NODE_FETCHES_SUFFIX, "a", encoding="utf-8") as record:
        fcntl.flock(record, fcntl.LOCK_EX)  # released when the file is closed, or the process dies
        copied = not _node_copy_complete(dest, files)
        if copied:
            _copy_to_node(uri, fs, base, files, dest, log)
        else:
            log(f"model: using this node's copy {dest}")
        record.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "at": _now(), "copied": copied,
                                 "files": len(files), "seconds": round(time.monotonic() - start, 3)}) + "\n")
    return dest


def _marker_files(marker: Dict[str, Any], uri: str) -> List[Tuple[str, int]]:
    """The marker's (path, size) list; every path must name a file at the snapshot's root,
    since each becomes a file in the node's copy."""
    files = [(str(f["path"]), int(f["size"])) for f in marker["files"]]
    bad = [p for p, _ in files if "/" in p or "\\" in p or p in ("", ".", "..") or p.startswith(RESERVED_PREFIX)]
    if bad:
        raise ValueError(f"{MARKER} at {uri} lists {bad}: staged files are at the snapshot's root and never "
                         f"named {RESERVED_PREFIX}*")
    return files


def _node_copy_complete(dest: str, files: Sequence[Tuple[str, int]]) -> bool:
    if not os.path.isfile(os.path.join(dest, NODE_COMPLETE)):
        return False
    return all(os.path.isfile(os.path.join(dest, p)) and os.path.getsize(os.path.join(dest, p)) == n
               for p, n in files)


def _copy_to_node(uri: str, fs, base: str, files: Sequence[Tuple[str, int]], dest: str, log: Log) -> None:
    import shutil

    shutil.rmtree(dest, ignore_errors=True)  # a copy cut short, or one that no longer matches
    os.makedirs(dest)
    total = sum(n for _, n in files)
    progress = _Progress(f"copying {uri} to {dest}", len(files), total, log)
    with progress:
        _each(files, lambda f: _bucket_to_local(uri, fs, base, f[0], f[1], dest, progress))
    doc = {"uri": uri, "files": len(files), "bytes": total, "seconds": round(progress.seconds(), 3), "at": _now()}
    tmp = os.path.join(dest, NODE_COMPLETE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, os.path.join(dest, NODE_COMPLETE))
    log(f"model: copied {progress.summary()} from {uri} to {dest}")


def _bucket_to_local(uri: str, fs, base: str, path: str, size: int, dest: str, progress: _Progress) -> None:
    local = os.path.join(dest, path)
    with fs.open_input_stream(posixpath.join(base, path)) as src, open(local, "wb") as dst:
        copied = _pump(src.read, dst.write, progress)
    if copied != size:
        raise OSError(f"{uri}/{path}: copied {copied} bytes, {MARKER} lists {size}")
    progress.file_done()
