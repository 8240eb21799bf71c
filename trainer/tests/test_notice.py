"""The preemption notice in the training loop, in one process (no Ray): the
report callback in transformers' real loop, with a notice that comes at a
chosen step, and the driver's SIGTERM handler."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import pytest

import modeling
import notice
import sft
import worker
from conftest import TRAINER_DIR

ROWS = 5  # one worker, batch 1, no accumulation: 5 steps per epoch


class NoticeAt:
    """A notice that arrives after the given step (Watch's interface)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.calls = 0

    def due(self) -> bool:
        self.calls += 1
        return self.calls >= self.step


def _args(save_strategy, epochs, max_steps):
    return argparse.Namespace(
        epochs=epochs, max_steps=max_steps, per_device_batch_size=1, gradient_accumulation_steps=1,
        gradient_checkpointing=False, learning_rate=1e-3, lr_scheduler="constant", warmup_ratio=0.0,
        max_grad_norm=1.0, logging_steps=100, save_strategy=save_strategy, save_steps=100, use_gpu=False,
        seed=0, max_seq_length=512, dataloader_num_workers=0,
    )


def _train(monkeypatch, assets, processor, dataset, tmp_path, args, watch, beat=None):
    """Train with the report callback; return it and what it reported to Ray."""
    import ray.train

    import data

    reports = []
    monkeypatch.setattr(ray.train, "report", lambda metrics, checkpoint=None: reports.append(
        (dict(metrics), checkpoint is not None)))
    model = modeling.load_model(assets["model"], "none", "sdpa", use_gpu=False)
    trainer = sft.trainer_class()(
        model=model, args=worker.sft_config(args, str(tmp_path)), train_dataset=dataset.select(range(ROWS)),
        processing_class=processor, data_collator=data.Collator(processor),
        peft_config=modeling.lora_config(8, 16, 0.0),
    )
    evaluations = []
    callback = worker._make_callback_class()(
        {}, evaluate=lambda: evaluations.append(1) or {"eval_loss": 1.0}, watch=watch, heartbeat=beat)
    trainer.add_callback(callback)
    trainer.train()
    return callback, reports, evaluations


@pytest.mark.parametrize("strategy", ["epoch", "steps"])
def test_one_save_per_notice(monkeypatch, assets, processor, dataset, tmp_path, strategy):
    """A notice mid-epoch: one evaluation and one checkpoint of that step, then
    the run stops, whatever the save strategy (with "epoch", transformers asks
    for a save again at the epoch's end it jumps to)."""
    callback, reports, evaluations = _train(monkeypatch, assets, processor, dataset, tmp_path,
                                            _args(strategy, epochs=3, max_steps=-1), NoticeAt(2))
    assert callback.preempted_at == 2
    saves = [m["step"] for m, has_checkpoint in reports if has_checkpoint]
    assert saves == [2], reports
    assert len(evaluations) == 1
    assert reports[-1][0][notice.PREEMPTED_KEY] == 2 and reports[-1][0]["global_step"] == 2


@pytest.mark.parametrize("strategy", ["epoch", "steps"])
def test_a_notice_after_the_last_step_is_ignored(monkeypatch, assets, processor, dataset, tmp_path, strategy):
    """The run has finished: it is not marked preempted, and saves once."""
    steps = 3
    callback, reports, evaluations = _train(monkeypatch, assets, processor, dataset, tmp_path,
                                            _args(strategy, epochs=1, max_steps=steps), NoticeAt(steps))
    assert callback.preempted_at is None
    assert [m["step"] for m, has_checkpoint in reports if has_checkpoint] == [steps], reports
    assert len(evaluations) == 1
    final = reports[-1][0]
    assert "train_runtime" in final and notice.PREEMPTED_KEY not in final
    # The last step is logged, so train_loss is the mean of logged all-rank losses.
    assert any(m.get("loss") is not None and m["step"] == steps for m, _ in reports[:-1]), reports


HANDLER_CHILD = r"""
import io, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import notice


class SignalledWhileWriting(io.RawIOBase):
    # sys.stdout's raw stream: the SIGTERM comes while the main thread is
    # inside a write to sys.stdout (holding its buffer's lock), every time,
    # which otherwise depends on when the node's shutdown comes.
    signalled = False

    def writable(self):
        return True

    def write(self, b):
        if not SignalledWhileWriting.signalled:
            SignalledWhileWriting.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
        return os.write(1, bytes(b))


sys.stdout = io.TextIOWrapper(io.BufferedWriter(SignalledWhileWriting()), write_through=True)
notice.put = lambda key: None  # no Ray here: only the handler's own output is in question
notice.OnSigterm("attempt-x", lambda msg: print("raydrop: " + msg, flush=True))
try:
    print("training goes on", flush=True)
except RuntimeError as exc:
    os.write(2, ("main thread: %s\n" % exc).encode())
    sys.exit(5)
time.sleep(1)  # the notice thread logs
sys.stdout.flush()
"""


def test_sigterm_handler_never_writes_through_sys_stdout(tmp_path):
    """A handler that prints while the main thread is inside a write to
    sys.stdout raises "reentrant call" in the main thread and fails the run."""
    proc = subprocess.run([sys.executable, "-c", HANDLER_CHILD, TRAINER_DIR], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"training goes on" in proc.stdout and b"gave the workers notice" in proc.stdout, proc.stdout


def test_a_worker_tells_the_driver_of_its_notice_file_once(monkeypatch, tmp_path):
    """The worker that finds its node's notice file puts the attempt's key in Ray's
    store, once, so that the driver's mark says a notice came even if the node dies
    before the save ends."""
    put = []
    monkeypatch.setattr(notice, "put", put.append)
    where = str(tmp_path / "notice")
    watch = notice.Watch(where=where, tell_key="attempt-k")
    assert not watch.due() and put == []
    notice.give(where)
    assert watch.due() and watch.due()
    assert put == ["attempt-k"]
    # Without a key (an older driver), nothing is put and the notice still counts.
    silent = notice.Watch(where=where)
    assert silent.due() and put == ["attempt-k"]
