"""The driver log keeper: tees the driver's output and copies it beside the run."""

import os
import subprocess
import sys
import time

import driverlog


def _copied(keeper, target, want, limit=5.0):
    """Copy until the copy holds want (the pumps copy the pipes asynchronously)."""
    deadline = time.time() + limit
    while time.time() < deadline:
        assert keeper.copy() is None
        if target.exists() and want in target.read_text():
            return target.read_text()
        time.sleep(0.05)
    return target.read_text() if target.exists() else ""


def test_copies_what_the_process_and_its_children_write(tmp_path, capfd):
    keeper = driverlog.Keeper(str(tmp_path), "attempt-1", every=3600)
    os.write(1, b"raydrop: first line\n")
    os.write(2, b"a warning\n")
    subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
    target = tmp_path / "attempt-1" / driverlog.LOG_FILE
    kept = _copied(keeper, target, "from a child process")
    for line in ("raydrop: first line\n", "a warning\n", "from a child process\n"):
        assert line in kept
    os.write(1, b"raydrop: last line\n")
    keeper.close()
    assert target.read_text().endswith("raydrop: last line\n")
    assert keeper.uri == os.path.join(str(tmp_path), "attempt-1", driverlog.LOG_FILE)
    # The output still reached the process's own standard output and error.
    out, err = capfd.readouterr()
    assert "raydrop: first line" in out and "raydrop: last line" in out and "a warning" in err
    os.write(1, b"after close\n")
    assert "after close" not in target.read_text()


def test_a_failed_copy_is_reported_and_retried(tmp_path, capfd):
    keeper = driverlog.Keeper(str(tmp_path), "attempt-1", every=3600)
    real = keeper._fs

    class Refusing:
        def create_dir(self, *a, **k):
            raise OSError("403 Forbidden")

    keeper._fs = Refusing()
    os.write(1, b"kept later\n")
    time.sleep(0.2)
    assert "403 Forbidden" in keeper.copy()
    keeper._fs = real
    keeper.close()
    assert (tmp_path / "attempt-1" / driverlog.LOG_FILE).read_text() == "kept later\n"
    assert "could not copy the driver log" in capfd.readouterr().err
