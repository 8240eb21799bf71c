"""The training heartbeat (heartbeat.py): what each rank writes for the pipeline's
stall detection, through the real filesystem and in transformers' real loop."""

from __future__ import annotations

import json
import os
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
