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
"""

from __future__ import annotations

import collections
import os
import posixpath
import socket
import statistics
import threading
import time
from typing import Any, Callable, Deque, Dict, Optional

import result

DIR = "raydrop_heartbeat"
INTERVAL_ENV = "RAYDROP_HEARTBEAT_S"
INTERVAL_S = 30.0
# The median step time is over the last this many steps: recent enough to
# follow a change of pace (a longer sequence bucket), long enough that one
# slow step (a checkpoint's) moves it little.
WINDOW = 50


def file_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def interval() -> float:
    """The beat's period: RAYDROP_HEARTBEAT_S, or INTERVAL_S when unset or not a positive number."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return INTERVAL_S
    return value if value > 0 else INTERVAL_S


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
            if self._stop.wait(self.every):
                return
