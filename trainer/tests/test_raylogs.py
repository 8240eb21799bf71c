"""The Ray log collector: copies a node's Ray log folder beside the run, the changed
files only, each capped, every few seconds and once more on SIGTERM. (Against a real Ray
session's folder: test_ray_train.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import raylogs


def _layout(logs):
    (logs / "old_logs").mkdir(parents=True)
    (logs / "raylet.out").write_text("raylet started\n")
    (logs / "worker-ab12-01000000-4242.out").write_text("rank 3: step 1\n")
    (logs / "old_logs" / "gcs_server.err").write_text("")


def test_copies_the_folder_then_only_what_changed(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    _layout(logs)
    c = raylogs.Collector(str(logs), str(dest))
    assert c.sync() == (3, None)
    for rel in ("raylet.out", "worker-ab12-01000000-4242.out", "old_logs/gcs_server.err"):
        assert (dest / rel).read_bytes() == (logs / rel).read_bytes()
    assert c.sync() == (0, None)  # nothing changed: nothing written
    with open(logs / "worker-ab12-01000000-4242.out", "a") as f:
        f.write("rank 3: CUDA out of memory\n")
    (logs / "runtime_env_agent.log").write_text("agent\n")
    assert c.sync() == (2, None)
    assert (dest / "worker-ab12-01000000-4242.out").read_text().endswith("CUDA out of memory\n")
    index = json.loads((dest / raylogs.INDEX).read_text())
    assert index["files"]["runtime_env_agent.log"] == {"bytes": 6, "kept": 6, "capped": False}
    assert set(index["files"]) == {"raylet.out", "worker-ab12-01000000-4242.out", "old_logs/gcs_server.err", "runtime_env_agent.log"}


def test_a_long_file_keeps_its_end(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    logs.mkdir()
    big = b"".join(b"line %06d\n" % i for i in range(10000))  # 120,000 bytes
    (logs / "worker-1.out").write_bytes(big)
    c = raylogs.Collector(str(logs), str(dest), cap=1000)
    assert c.sync() == (1, None)
    assert (dest / "worker-1.out").read_bytes() == big[-1000:]
    assert json.loads((dest / raylogs.INDEX).read_text())["files"]["worker-1.out"] == {"bytes": len(big), "kept": 1000, "capped": True}


def test_a_failed_copy_is_reported_and_tried_again(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    _layout(logs)
    dest.mkdir()
    (dest / "old_logs").write_text("a file where the folder should be")
    c = raylogs.Collector(str(logs), str(dest))
    written, err = c.sync()
    assert written == 2 and "old_logs" in err
    (dest / "old_logs").unlink()
    assert c.sync() == (1, None)  # only the one that failed
    assert (dest / "old_logs" / "gcs_server.err").exists()


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cap 0"):
        raylogs.Collector(str(tmp_path), str(tmp_path / "d"), cap=0)
    proc = subprocess.run([sys.executable, "raylogs.py", "--dest", str(tmp_path / "d"), "--every", "0"],
                          capture_output=True, text=True, cwd=os.path.dirname(raylogs.__file__))
    assert proc.returncode == 2 and "--every 0.0: must be a positive number of seconds" in proc.stderr


def test_sigterm_copies_once_more_then_exits(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    _layout(logs)
    proc = subprocess.Popen([sys.executable, "raylogs.py", "--logs", str(logs), "--dest", str(dest), "--every", "3600"],
                            cwd=os.path.dirname(raylogs.__file__), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not (dest / raylogs.INDEX).exists():  # the first copy, at start
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "no first copy"
        time.sleep(0.05)
    with open(logs / "raylet.out", "a") as f:
        f.write("raylet: SIGTERM received, shutting down\n")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert (dest / "raylet.out").read_text().endswith("SIGTERM received, shutting down\n")
