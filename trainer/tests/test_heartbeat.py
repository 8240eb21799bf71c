"""The training heartbeat (heartbeat.py): what each rank writes for the pipeline's
stall detection, through the real filesystem and in transformers' real loop."""

from __future__ import annotations

import json
import os
import threading
import time

import heartbeat
from test_notice import _args, _train


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _read(beat: heartbeat.Heartbeat):
    with open(beat.path, encoding="utf-8") as f:
        return json.load(f)


def test_a_beat_says_the_step_its_time_and_the_median(tmp_path):
    clock = Clock()
    beat = heartbeat.Heartbeat(str(tmp_path), "exp", 3, every=60, clock=clock)
    assert beat.path == os.path.join(str(tmp_path), "exp", heartbeat.DIR, "rank-00003.json")
    assert beat.beat()
    doc = _read(beat)
    # Before the first step: alive, but no clock has started.
    assert doc["step"] == 0 and doc["stepAt"] is None and doc["firstStepAt"] is None and doc["stepSeconds"] is None
    assert doc["activity"] == "starting" and doc["rank"] == 3 and doc["pid"] == os.getpid()
    for step, at in ((1, 1100.0), (2, 1102.0), (2, 1103.0), (3, 1105.0), (4, 1110.0)):
        clock.t = at
        beat.step(step)
    clock.t = 1111.0
    beat.note("evaluating")
    clock.t = 1120.0
    assert beat.beat()
    doc = _read(beat)
    assert doc["step"] == 4 and doc["stepAt"] == 1110.0 and doc["firstStepAt"] == 1100.0
    # Step times 2, 3, 5 (the repeated step 2 is not a step): median 3.
    assert doc["stepSeconds"] == 3.0
    assert doc["activity"] == "evaluating" and doc["activityAt"] == 1111.0 and doc["at"] == 1120.0


def test_the_thread_beats_until_stopped(tmp_path):
    beat = heartbeat.Heartbeat(str(tmp_path), "exp", 0, every=0.05).start()
    deadline = time.time() + 10
    while not os.path.exists(beat.path) and time.time() < deadline:
        time.sleep(0.01)
    first = _read(beat)["at"]
    beat.step(1)
    time.sleep(0.2)
    assert _read(beat)["at"] > first and _read(beat)["step"] == 1
    beat.stop()
    assert _read(beat)["activity"] == "ended"


def test_a_failed_write_is_logged_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    said = []
    beat = heartbeat.Heartbeat(str(blocker), "exp", 0, every=60, log=said.append)
    assert not beat.beat() and not beat.beat()
    assert len(said) == 1 and "could not write" in said[0] and "1 failures" in said[0], said


def test_the_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv(heartbeat.INTERVAL_ENV, "2.5")
    assert heartbeat.interval() == 2.5
    for bad in ("", "soon", "-1", "0"):
        monkeypatch.setenv(heartbeat.INTERVAL_ENV, bad)
        assert heartbeat.interval() == heartbeat.INTERVAL_S


def test_the_training_loop_beats_each_step_and_its_save(monkeypatch, assets, processor, dataset, tmp_path):
    """In transformers' real loop: each optimizer step reaches the heartbeat, and a
    checkpoint's evaluation and save show as what the rank does after its step."""
    seen = []

    class Recording(heartbeat.Heartbeat):
        def step(self, step):
            seen.append(("step", step))
            super().step(step)

        def note(self, activity):
            seen.append(("note", activity))
            super().note(activity)

    beat = Recording(str(tmp_path / "store"), "exp", 0, every=60)
    _train(monkeypatch, assets, processor, dataset, tmp_path, _args("steps", epochs=1, max_steps=3), None, beat)
    assert seen == [("step", 1), ("step", 2), ("step", 3), ("note", "evaluating"), ("note", "saving")], seen
    assert beat.snapshot()["step"] == 3 and beat.snapshot()["activity"] == "saving"


def _request(tmp_path, rid, why="no progress since step 3"):
    path = os.path.join(str(tmp_path), "exp", heartbeat.DIR, heartbeat.STACKS_REQUEST)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"id": rid, "why": why}, f)


def test_the_monitors_request_is_answered_with_every_threads_stack(tmp_path, monkeypatch):
    """The stacks go to the evidence folder, once per request; a thread waiting in a
    collective shows where it waits."""
    evidence = tmp_path / "evidence" / "attempt-1"
    monkeypatch.setenv(heartbeat.EVIDENCE_ENV, str(evidence))
    monkeypatch.delenv(heartbeat.PY_SPY_ENV, raising=False)
    beat = heartbeat.Heartbeat(str(tmp_path), "exp", 2, every=60)
    assert beat.stacks_path == os.path.join(str(evidence), heartbeat.STACKS_DIR, "rank-00002.txt")
    assert beat.look() is None and not os.path.exists(beat.stacks_path)

    release = threading.Event()

    def all_reduce_like():
        release.wait(30)

    stuck = threading.Thread(target=all_reduce_like, name="stuck-in-collective")
    stuck.start()
    try:
        _request(tmp_path, "1")
        assert beat.look() == "asked by the monitor: no progress since step 3"
    finally:
        release.set()
        stuck.join()
    with open(beat.stacks_path, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("raydrop stacks of rank 2, pid %d" % os.getpid()), text[:200]
    assert "asked by the monitor: no progress since step 3" in text
    assert '"MainThread" (most recent call last):' in text and "test_the_monitors_request_is_answered" in text
    assert '"stuck-in-collective" (most recent call last):' in text and "in all_reduce_like" in text
    assert "release.wait(30)" in text
    assert beat.look() is None  # answered
    _request(tmp_path, "2")
    assert beat.look() is not None


def test_a_rank_writes_its_stacks_when_its_own_step_stalls(tmp_path, monkeypatch):
    monkeypatch.delenv(heartbeat.EVIDENCE_ENV, raising=False)
    monkeypatch.setenv(heartbeat.STALL_AFTER_ENV, "10")
    monkeypatch.setenv(heartbeat.STALL_FACTOR_ENV, "5")
    clock = Clock()
    beat = heartbeat.Heartbeat(str(tmp_path), "exp", 0, every=60, clock=clock)
    # Without a step no clock runs, however long the loading takes.
    clock.t = 5000.0
    assert beat.look() is None
    beat.step(1)
    clock.t = 5010.0
    assert beat.look() is None
    clock.t = 5011.0
    assert beat.look() == "its own step has not moved for 11 s (window 10 s)"
    assert os.path.exists(os.path.join(str(tmp_path), "exp", heartbeat.DIR, heartbeat.STACKS_DIR, "rank-00000.txt"))
    clock.t = 5100.0
    assert beat.look() is None  # once per stalled step
    beat.step(2)  # a 100 s step (from 5000): the window grows to 5 x 100 s
    clock.t = 5100.0 + 500
    assert beat.look() is None
    clock.t = 5100.0 + 501
    assert beat.look() is not None
    beat.note("ended")
    clock.t = 9000.0
    beat.step(3)
    beat.note("ended")
    assert beat.look() is None  # a rank that ended training has nothing to stall


def test_py_spy_only_where_the_job_may_ptrace(monkeypatch):
    monkeypatch.delenv(heartbeat.PY_SPY_ENV, raising=False)
    assert heartbeat.py_spy(os.getpid()) is None
    monkeypatch.setenv(heartbeat.PY_SPY_ENV, "1")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert heartbeat.py_spy(os.getpid()) == "py-spy: not installed in this image\n"


STUCK_CHILD = r"""
import datetime, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
import torch
import torch.distributed as dist
import heartbeat

rank, init, out = int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
if rank == 1:
    time.sleep(15)  # never joins the all-reduce: rank 0 waits for it
    os._exit(0)
os.environ[heartbeat.EVIDENCE_ENV] = out
beat = heartbeat.Heartbeat(out, "exp", 0, every=60)
beat.step(41)

def dump():
    time.sleep(3)
    beat.dump("asked by the monitor: no progress since step 41")
    os._exit(0)

threading.Thread(target=dump, name="raydrop-heartbeat", daemon=True).start()
dist.all_reduce(torch.ones(4))
"""


def test_stacks_of_a_rank_stuck_in_a_real_all_reduce(tmp_path):
    """Two processes in a gloo process group; rank 1 never joins the all-reduce, so
    rank 0's main thread waits in torch.distributed, and its stacks show where."""
    import subprocess
    import sys

    from conftest import TRAINER_DIR

    init = "file://" + str(tmp_path / "rendezvous")
    out = str(tmp_path / "evidence")
    procs = [subprocess.Popen([sys.executable, "-c", STUCK_CHILD, TRAINER_DIR, str(r), init, out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    try:
        procs[0].wait(timeout=120)  # it exits once its stacks are written
    finally:
        procs[1].kill()  # the rank that never joins
        procs[1].wait(timeout=30)
    with open(os.path.join(out, heartbeat.STACKS_DIR, "rank-00000.txt"), encoding="utf-8") as f:
        text = f.read()
    main = text[text.index('"MainThread"'):]
    assert "in all_reduce" in main and "torch/distributed/distributed_c10d.py" in main, text
    assert 'Thread' in text and '"raydrop-heartbeat"' in text


def test_the_collective_timeout_follows_the_stall_window():
    import train

    assert train.collective_timeout_s({"RAYDROP_STALL_AFTER_S": "600"}) == 600 + train.COLLECTIVE_MARGIN_S
    assert train.collective_timeout_s({"RAYDROP_STALL_AFTER_S": "10"}) == 10 + train.COLLECTIVE_MARGIN_S
    for env in ({}, {"RAYDROP_STALL_AFTER_S": ""}, {"RAYDROP_STALL_AFTER_S": "soon"}):
        assert train.collective_timeout_s(env) == train.RAY_TRAIN_TIMEOUT_S
    assert heartbeat.STALL_AFTER_ENV == "RAYDROP_STALL_AFTER_S"
