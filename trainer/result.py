"""The completion mark: <storage-path>/<experiment-name>/raydrop_result.json.

Written by the driver as its last act, whether fit() returned or raised. It
is assembled from what Ray Train V1 persisted (the trial folder's result.json
lines), so it names exactly the checkpoints that exist in storage. All I/O
goes through the same pyarrow filesystem Ray resolves for the storage path,
so gs:// and local paths behave alike.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import threading
from typing import Any, Dict, List, Optional, Tuple

RESULT_FILE = "raydrop_result.json"
# The sample answers (samples.py), beside the mark.
SAMPLES_DIR = "samples"
SAMPLES_FILE = "samples.json"
SCHEMA_VERSION = 1
TRIAL_PREFIX = "TorchTrainer_"

# Keys Ray Train/Tune add to every reported result; the rest is ours.
RAY_KEYS = frozenset({
    "checkpoint_dir_name", "config", "date", "done", "experiment_tag", "hostname",
    "iterations_since_restore", "node_ip", "pid", "should_checkpoint", "time_since_restore",
    "time_this_iter_s", "time_total_s", "timestamp", "training_iteration", "trial_id",
    "timesteps_since_restore", "timesteps_total", "episodes_total",
})
FINAL_KEYS = (
    "train_loss", "train_runtime", "train_tokens", "tokens_per_second", "train_samples_per_second",
    "train_steps_per_second", "train_steps", "global_step", "epoch", "total_flos", "loss",
    "mean_token_accuracy", "num_tokens", "train_loss_tokens",
)


def is_uri(path: str) -> bool:
    return "://" in path


def normalize_storage_path(path: str) -> str:
    """Local paths become absolute (Ray wants that); URIs are kept, minus a trailing slash."""
    if is_uri(path):
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


# The Cloud Storage emulator's address (host:port, or a URL), the variable Google's
# own Cloud Storage clients read; never set on GKE.
STORAGE_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def emulated_gcs(uri: str) -> Optional[Tuple[Any, str]]:
    """(pyarrow filesystem, path within it) for a gs:// URI while STORAGE_EMULATOR_HOST
    names a Cloud Storage emulator (the local cloud's), else None. pyarrow's GCS
    client does not read that variable itself: without this it would ask Google's
    metadata server for credentials and reach for storage.googleapis.com."""
    host = os.environ.get(STORAGE_EMULATOR_ENV, "")
    if not host or not uri.startswith("gs://"):
        return None
    import pyarrow.fs

    scheme, _, address = host.rpartition("://")
    fs = pyarrow.fs.GcsFileSystem(anonymous=True, scheme=scheme or "http", endpoint_override=address.rstrip("/"))
    return fs, uri[len("gs://"):].rstrip("/")


def filesystem(storage_path: str) -> Tuple[Any, str]:
    """(pyarrow filesystem, path within it), resolved the way Ray Train resolves storage_path."""
    emulated = emulated_gcs(storage_path)
    if emulated:
        return emulated
    try:
        from ray.train._internal.storage import get_fs_and_path

        return get_fs_and_path(storage_path)
    except ImportError:  # pragma: no cover - Ray's internal layout moved
        import pyarrow.fs

        if is_uri(storage_path):
            return pyarrow.fs.FileSystem.from_uri(storage_path)
        return pyarrow.fs.LocalFileSystem(), storage_path


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if is_uri(base) else os.path.join(base, *parts)


def _trial_sort_key(name: str) -> str:
    m = re.search(r"(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})$", name)
    return (m.group(1) if m else "") + name


def find_trial(fs, experiment_fs_path: str, hint: Optional[str] = None) -> Optional[str]:
    """Base name of the experiment's trial folder (the newest if there are several)."""
    import pyarrow.fs

    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(experiment_fs_path, allow_not_found=True))
    except (OSError, ValueError):
        return None
    names = [posixpath.basename(i.path) for i in infos if i.type == pyarrow.fs.FileType.Directory]
    names = [n for n in names if n.startswith(TRIAL_PREFIX)]
    if hint and hint in names:
        return hint
    return max(names, key=_trial_sort_key) if names else None


def read_results(fs, trial_fs_path: str) -> List[Dict[str, Any]]:
    """Parsed result.json lines (a truncated last line is ignored)."""
    try:
        with fs.open_input_stream(posixpath.join(trial_fs_path, "result.json")) as f:
            text = f.read().decode("utf-8")
    except (OSError, FileNotFoundError):
        return []
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _metrics(row: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in row.items() if k not in RAY_KEYS and not isinstance(v, (dict, list))}


def summarize(rows: List[Dict[str, Any]], trial_uri: Optional[str]) -> Dict[str, Any]:
    """checkpoints, latestCheckpoint and finalMetrics from result.json rows."""
    checkpoints = []
    for row in rows:
        name = row.get("checkpoint_dir_name")
        if not name or trial_uri is None:
            continue
        path = join(trial_uri, name)
        checkpoints.append({
            "path": path,
            "dirName": name,
            "modelPath": join(path, "checkpoint"),
            "step": row.get("step"),
            "epoch": row.get("epoch"),
            "metrics": _metrics(row),
        })
    final: Dict[str, Any] = {}
    for row in reversed(rows):
        if "train_runtime" in row:
            final = {k: row[k] for k in FINAL_KEYS if k in row}
            break
    data = None
    for row in reversed(rows):
        if "dataset_rows" in row:
            data = {"rows": row["dataset_rows"], "droppedRows": row.get("dropped_rows"),
                    "maxSeqLength": row.get("max_seq_length"), "evalRows": row.get("eval_rows", 0)}
            break
    return {
        "checkpoints": checkpoints,
        "latestCheckpoint": checkpoints[-1]["path"] if checkpoints else None,
        "finalMetrics": final,
        "data": data,
    }


def build(
    storage_path: str,
    experiment_name: str,
    run_id: str,
    status: str,
    error: Optional[str],
    trial_hint: Optional[str] = None,
    notice_seen: bool = False,
) -> Dict[str, Any]:
    """The completion mark (schemas/mark.v1.json) of the experiment's attempt. notice_seen:
    a preemption notice reached the attempt (a failed mark with it is a node reclaimed
    before the save on notice ended)."""
    storage_path = normalize_storage_path(storage_path)
    experiment_uri = join(storage_path, experiment_name)
    fs, base = filesystem(storage_path)
    experiment_fs_path = posixpath.join(base, experiment_name)
    trial = find_trial(fs, experiment_fs_path, trial_hint)
    trial_uri = join(experiment_uri, trial) if trial else None
    rows = read_results(fs, posixpath.join(experiment_fs_path, trial)) if trial else []
    doc: Dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "runId": run_id,
        "status": status,
        "error": error,
        "experimentPath": experiment_uri,
        "trialPath": trial_uri,
    }
    doc.update(summarize(rows, trial_uri))
    doc["samples"] = samples_summary(fs, experiment_fs_path, experiment_uri)
    doc["noticeSeen"] = notice_seen
    return doc


def failed_early(storage_path: str, experiment_name: str, run_id: str, error: str) -> Dict[str, Any]:
    """The mark of an attempt that failed before training started (Ray unreachable, a bad
    storage path): nothing was written, no notice was seen."""
    return {
        "schemaVersion": SCHEMA_VERSION, "runId": run_id, "status": "failed", "error": error,
        "experimentPath": join(normalize_storage_path(storage_path), experiment_name),
        "trialPath": None, "checkpoints": [], "latestCheckpoint": None, "finalMetrics": {},
        "data": None, "samples": None, "noticeSeen": False,
    }


def samples_summary(fs, experiment_fs_path: str, experiment_uri: str) -> Optional[Dict[str, Any]]:
    """The mark's samples entry ({uri, count, seconds}), or None when none were written."""
    path = posixpath.join(experiment_fs_path, SAMPLES_DIR, SAMPLES_FILE)
    try:
        with fs.open_input_stream(path) as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, FileNotFoundError, ValueError):
        return None
    return {"uri": join(experiment_uri, SAMPLES_DIR, SAMPLES_FILE), "count": doc.get("count", 0),
            "seconds": doc.get("seconds", 0.0)}


def write(storage_path: str, experiment_name: str, doc: Dict[str, Any]) -> str:
    """Write the mark; returns its URI or path."""
    storage_path = normalize_storage_path(storage_path)
    fs, base = filesystem(storage_path)
    directory = posixpath.join(base, experiment_name)
    fs.create_dir(directory, recursive=True)
    put_json(fs, posixpath.join(directory, RESULT_FILE), doc)
    return join(storage_path, experiment_name, RESULT_FILE)


def put_json(fs, path: str, doc: Dict[str, Any]) -> None:
    """Write doc at path whole, so that no reader sees half of it: an object store
    publishes an object only once it is fully written; a local file is written beside
    and renamed (the name is the writer's own, so concurrent writers never share one)."""
    import pyarrow.fs

    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
    if not isinstance(fs, pyarrow.fs.LocalFileSystem):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    fs.move(tmp, path)


def announce(notice: str, mark: str) -> None:
    """Write the mark's notice: a small object whose name alone tells the pipeline that a
    mark exists (the checkpoint bucket's notification matches only these names, so the
    checkpoint files wake nothing). Its content names the mark."""
    import pyarrow.fs

    data = (json.dumps({"mark": mark}, sort_keys=True) + "\n").encode("utf-8")
    if is_uri(notice):
        fs, path = emulated_gcs(notice) or pyarrow.fs.FileSystem.from_uri(notice)
    else:
        fs, path = pyarrow.fs.LocalFileSystem(), os.path.abspath(notice)
        fs.create_dir(os.path.dirname(path), recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def redact(text: str, secrets: List[str]) -> str:
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "[REDACTED]")
    return text


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception: through __cause__ chains and Ray's wrapped task errors."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError keeps the original here
        if isinstance(inner, BaseException):
            exc = inner
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            break
    return exc


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """A short application error, "SomeError: message", from the root cause of a failure."""
    cause = root_cause(exc)
    text = str(cause)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    pick = None
    for ln in reversed(lines):  # a traceback's last "XError: ..." line, if the text is one
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*", ln):
            pick = ln
            break
    if pick is None:
        pick = f"{type(cause).__name__}: {text.strip()}" if lines else type(cause).__name__
    secrets = [os.environ.get("HF_TOKEN", ""), os.environ.get("HUGGING_FACE_HUB_TOKEN", "")]
    return redact(pick, secrets)[:limit]
