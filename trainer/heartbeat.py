"""The training heartbeat: each rank's progress, for the pipeline's stall detection.

Every Ray Train worker runs a thread that rewrites

    <storage-path>/<experiment>/raydrop_heartbeat/rank-<NNNNN>.json

every INTERVAL_S seconds (RAYDROP_HEARTBEAT_S), and at once when training
starts and ends. It says the rank's last optimizer step and when it ended,
when the first step of this attempt ended, the median of the rank's recent
step times, and what the rank does now between two steps (a checkpoint's
evaluation, its upload) and since when. The pipeline's monitor reads them
(pkg/checkpoints.ReadBeats) and suspects a stall when no rank has moved for
max(limits.stallAfter, limits.stallFactor x the median step time), counting
from the first step, so that loading the model and compiling never count.

The thread only reads what the training loop's callback notes (step(),
note()), so the loop pays two assignments per step. A rank stuck inside a
collective keeps its thread writing with an old step: that is what a stall
looks like from outside. A write that fails is logged and tried again at the
next beat; the heartbeat never fails the training.

Stacks. At each beat the thread also looks for the monitor's request,
raydrop_heartbeat/stacks-request.json, and watches its own rank: when its
step has not moved for the run's stall window (RAYDROP_STALL_AFTER_S,
RAYDROP_STALL_FACTOR, from the job's runtime env). Either way it writes
every thread's Python stack of its process (sys._current_frames(): no
privilege needed) to stacks/rank-<NNNNN>.txt in the attempt's evidence folder
(RAYDROP_EVIDENCE; without one, beside the heartbeats), once per request and
once per stalled step. Where the job's containers may ptrace
(RAYDROP_PY_SPY=1, set with the SYS_PTRACE capability), `py-spy dump
--native` adds the native frames, which show where a collective waits. A
thread that holds the GIL in native code stops this thread too; py-spy, a
separate process, still answers then.
"""

from __future__ import annotations

import collections
import json
import os
import posixpath
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable, Deque, Dict, Optional

import result

DIR = "raydrop_heartbeat"
INTERVAL_ENV = "RAYDROP_HEARTBEAT_S"
INTERVAL_S = 30.0
# The monitor's request for stacks, beside the heartbeats.
STACKS_REQUEST = "stacks-request.json"
STACKS_DIR = "stacks"
EVIDENCE_ENV = "RAYDROP_EVIDENCE"
STALL_AFTER_ENV = "RAYDROP_STALL_AFTER_S"
STALL_FACTOR_ENV = "RAYDROP_STALL_FACTOR"
PY_SPY_ENV = "RAYDROP_PY_SPY"
PY_SPY_TIMEOUT_S = 60
# The median step time is over the last this many steps: recent enough to
# follow a change of pace (a longer sequence bucket), long enough that one
# slow step (a checkpoint's) moves it little.
WINDOW = 50


def file_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def _positive(name: str, default: Optional[float]) -> Optional[float]:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def interval() -> float:
    """The beat's period: RAYDROP_HEARTBEAT_S, or INTERVAL_S when unset or not a positive number."""
    return _positive(INTERVAL_ENV, INTERVAL_S)


def stacks_text(header: str) -> str:
    """Every thread's Python stack in this process, most recent call last, named as
    threading names them."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = [header, ""]
    for ident, frame in sorted(sys._current_frames().items()):
        out.append(f'Thread {ident:#x} "{names.get(ident, "?")}" (most recent call last):')
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        out.append("")
    return "\n".join(out) + "\n"


def py_spy(pid: int) -> Optional[str]:
    """`py-spy dump --native` of pid where the job may ptrace (RAYDROP_PY_SPY=1), else None."""
    if os.environ.get(PY_SPY_ENV) != "1":
        return None
    exe = shutil.which("py-spy")
    if exe is None:
        return "py-spy: not installed in this image\n"
    try:
        done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=PY_SPY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"py-spy: no answer within {PY_SPY_TIMEOUT_S} s\n"
    if done.returncode != 0:
        return f"py-spy: exit {done.returncode}: {done.stderr.strip()[-2000:]}\n"
    return done.stdout


class Heartbeat:
    """One rank's heartbeat. step() and note() are called by the training loop;
    start() begins the writing thread, stop() ends it after a last write."""

    def __init__(self, storage_path: str, experiment_name: str, rank: int, every: Optional[float] = None,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] = print) -> None:
        storage_path = result.normalize_storage_path(storage_path)
        self._fs, base = result.filesystem(storage_path)
        self._dir = posixpath.join(base, experiment_name, DIR)
        self.path = posixpath.join(self._dir, file_name(rank))
        self.rank = rank
        self.every = every if every is not None else interval()
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self._step = 0
        self._step_at: Optional[float] = None
        self._first_step_at: Optional[float] = None
        self._times: Deque[float] = collections.deque(maxlen=WINDOW)
        self._activity = "starting"
        self._activity_at = clock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failures = 0
        self._dir_made = False
        # Stacks: where they go, the request answered last, the stalled step dumped last.
        evidence = os.environ.get(EVIDENCE_ENV)
        if evidence:
            evidence = result.normalize_storage_path(evidence)
            self._stacks_fs, stacks_base = result.filesystem(evidence)
        else:
            self._stacks_fs, stacks_base = self._fs, self._dir
        self.stacks_path = posixpath.join(stacks_base, STACKS_DIR, file_name(rank).replace(".json", ".txt"))
        self._request_path = posixpath.join(self._dir, STACKS_REQUEST)
        self._answered: Optional[str] = None
        self._dumped_step: Optional[int] = None
        self.stall_after = _positive(STALL_AFTER_ENV, None)
        self.stall_factor = _positive(STALL_FACTOR_ENV, 5.0)

    def step(self, step: int) -> None:
        """The optimizer step that just ended (global, so a resumed run goes on counting)."""
        now = self._clock()
        with self._lock:
            if step == self._step and self._step_at is not None:
                return
            if self._step_at is not None:
                self._times.append(now - self._step_at)
            if self._first_step_at is None:
                self._first_step_at = now
            self._step, self._step_at = step, now
            self._activity, self._activity_at = "training", now

    def note(self, activity: str) -> None:
        """What the rank does now between two steps ("evaluating", "saving"), from now."""
        now = self._clock()
        with self._lock:
            self._activity, self._activity_at = activity, now

    def snapshot(self) -> Dict[str, Any]:
        with self._lock:
            return {
                "rank": self.rank,
                "step": self._step,
                "stepAt": self._step_at,
                "firstStepAt": self._first_step_at,
                "stepSeconds": round(statistics.median(self._times), 4) if self._times else None,
                "activity": self._activity,
                "activityAt": self._activity_at,
                "at": self._clock(),
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }

    def beat(self) -> bool:
        """Write the heartbeat once; False (and a log line now and then) when the write failed."""
        try:
            if not self._dir_made:
                self._fs.create_dir(self._dir, recursive=True)
                self._dir_made = True
            result.put_json(self._fs, self.path, self.snapshot())
        except Exception as exc:  # noqa: BLE001 - a heartbeat never fails the training
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 100 == 0:
                self._log(f"heartbeat: could not write {self.path} ({self._failures} failures): {result.error_text(exc)}")
            return False
        self._failures = 0
        return True

    def look(self) -> Optional[str]:
        """Write the stacks when the monitor asks for them or this rank's step stalled;
        returns why it wrote them, None when it did not."""
        why = self._asked() or self._stalled()
        if why is None:
            return None
        try:
            self.dump(why)
        except Exception as exc:  # noqa: BLE001 - stacks never fail the training
            self._log(f"heartbeat: could not write the stacks to {self.stacks_path}: {result.error_text(exc)}")
        return why

    def _asked(self) -> Optional[str]:
        try:
            with self._fs.open_input_stream(self._request_path) as f:
                req = json.loads(f.read().decode("utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        except OSError as exc:
            # pyarrow's GCS raises OSError for a missing object on some versions.
            if "not found" in str(exc).lower() or "no such" in str(exc).lower():
                return None
            raise
        rid = str(req.get("id", ""))
        if rid == self._answered:
            return None
        self._answered = rid
        return f"asked by the monitor: {req.get('why', '')}".rstrip(": ")

    def _stalled(self) -> Optional[str]:
        snap = self.snapshot()
        if self.stall_after is None or snap["stepAt"] is None or snap["activity"] == "ended":
            return None
        window = max(self.stall_after, self.stall_factor * (snap["stepSeconds"] or 0.0))
        still = snap["at"] - max(snap["stepAt"], snap["activityAt"] or 0.0)
        if still <= window or self._dumped_step == snap["step"]:
            return None
        self._dumped_step = snap["step"]
        return f"its own step has not moved for {still:.0f} s (window {window:.0f} s)"

    def dump(self, why: str) -> None:
        """Write this process's stacks (and py-spy's, where allowed) with why."""
        snap = self.snapshot()
        header = (f"raydrop stacks of rank {self.rank}, pid {snap['pid']} on {snap['host']}, at "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(snap['at']))}: {why}\n"
                  f"last step {snap['step']}, {snap['activity']} since "
                  f"{time.strftime('%H:%M:%S', time.gmtime(snap['activityAt'] or snap['at']))} UTC")
        text = stacks_text(header)
        native = py_spy(os.getpid())
        if native:
            text += "\npy-spy dump --native:\n" + native
        parent = posixpath.dirname(self.stacks_path)
        self._stacks_fs.create_dir(parent, recursive=True)
        with self._stacks_fs.open_output_stream(self.stacks_path) as f:
            f.write(text.encode("utf-8"))

    def start(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._serve, name="raydrop-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every + 5)
        self.note("ended")
        self.beat()

    def _serve(self) -> None:
        while True:
            self.beat()
            try:
                self.look()
            except Exception as exc:  # noqa: BLE001 - a heartbeat never fails the training
                self._log(f"heartbeat: could not look for a request for stacks: {result.error_text(exc)}")
            if self._stop.wait(self.every):
                return
