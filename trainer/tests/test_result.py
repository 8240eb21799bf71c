"""raydrop_result.json assembly, error text and code hygiene."""

from __future__ import annotations

import ast
import glob
import json
import os
import re

import result
from conftest import TRAINER_DIR, check_mark

ROWS = [
    {"step": 10, "epoch": 0.5, "loss": 2.0, "learning_rate": 1e-4, "grad_norm": 1.0, "checkpoint_dir_name": None,
     "timestamp": 1, "config": {"x": 1}},
    {"step": 20, "epoch": 1.0, "loss": 1.5, "learning_rate": 1e-4, "grad_norm": 0.9,
     "checkpoint_dir_name": "checkpoint_000000", "training_iteration": 2},
    {"step": 20, "epoch": 1.0, "train_runtime": 10.0, "train_loss": 1.7, "train_tokens": 1000.0,
     "tokens_per_second": 100.0, "checkpoint_dir_name": None},
]


def test_summarize():
    s = result.summarize(ROWS, "gs://b/p/exp/TorchTrainer_abcde_00000_0_2025-01-01_00-00-00")
    (ck,) = s["checkpoints"]
    assert ck["path"].endswith("/checkpoint_000000") and ck["modelPath"].endswith("/checkpoint_000000/checkpoint")
    assert ck["step"] == 20 and ck["epoch"] == 1.0
    assert ck["metrics"] == {"step": 20, "epoch": 1.0, "loss": 1.5, "learning_rate": 1e-4, "grad_norm": 0.9}
    assert s["latestCheckpoint"] == ck["path"]
    assert s["finalMetrics"]["tokens_per_second"] == 100.0 and "checkpoint_dir_name" not in s["finalMetrics"]


def test_build_and_write_local(tmp_path):
    trial = tmp_path / "exp" / "TorchTrainer_abcde_00000_0_2025-01-01_00-00-00"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + '{"trunc')
    doc = result.build(str(tmp_path), "exp", "r1", "succeeded", None)
    assert doc["trialPath"] == str(trial) and doc["latestCheckpoint"] == str(trial / "checkpoint_000000")
    where = result.write(str(tmp_path), "exp", doc)
    assert json.loads(open(where).read()) == doc
    check_mark(doc)
    empty = check_mark(result.build(str(tmp_path), "none-yet", "r1", "failed", "X", notice_seen=True))
    assert empty["trialPath"] is None and empty["checkpoints"] == [] and empty["finalMetrics"] == {}
    assert empty["noticeSeen"] is True and doc["noticeSeen"] is False


def test_a_mark_before_training_started(tmp_path):
    """Ray unreachable or a bad storage path: the mark still says what went wrong, in the schema."""
    doc = check_mark(result.failed_early(str(tmp_path), "exp", "r1", "ConnectionError: no Ray at 127.0.0.1:1"))
    assert doc["status"] == "failed" and doc["noticeSeen"] is False and doc["experimentPath"] == str(tmp_path / "exp")


def test_announce_names_the_mark(tmp_path):
    notice = tmp_path / "raydrop-marks" / "r1" / "attempt-1.json"
    result.announce(str(notice), "gs://b/p/r1/attempt-1/raydrop_result.json")
    assert json.loads(notice.read_text()) == {"mark": "gs://b/p/r1/attempt-1/raydrop_result.json"}


def test_error_text_takes_root_cause_and_redacts(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    try:
        try:
            raise FileNotFoundError("no dataset at /x (token hf_secretvalue123)")
        except FileNotFoundError as inner:
            raise RuntimeError("Training failed, see cause") from inner
    except RuntimeError as exc:
        text = result.error_text(exc)
    assert text.startswith("FileNotFoundError: no dataset at /x")
    assert "hf_secretvalue123" not in text and "[REDACTED]" in text
    tb = RuntimeError("Traceback (most recent call last):\n  File x\nValueError: bad thing\n")
    assert result.error_text(tb) == "ValueError: bad thing"


def test_modules_run_on_python_39():
    for path in glob.glob(os.path.join(TRAINER_DIR, "*.py")) + glob.glob(os.path.join(TRAINER_DIR, "bench", "*.py")):
        src = open(path).read()
        ast.parse(src, filename=path, feature_version=(3, 9))  # no match statements etc.
        assert "from __future__ import annotations" in src, path


def test_requirements_are_plain_pins():
    pins = {}
    for line in open(os.path.join(TRAINER_DIR, "requirements.txt")):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[a-z,]+\])?==([0-9][0-9A-Za-z.+-]*)", line)
        assert m, line
        pins[m.group(1)] = m.group(3)
    assert pins == {
        "torch": "2.8.0", "torchvision": "0.23.0", "ray": "2.48.0", "transformers": "4.55.2",
        "datasets": "4.0.0", "evaluate": "0.4.5", "accelerate": "1.10.0", "pillow": "11.3.0",
        "bitsandbytes": "0.47.0", "trl": "0.21.0", "peft": "0.17.0",
    }
