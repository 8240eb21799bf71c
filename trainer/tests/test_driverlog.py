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
    kept = _copied(keeper, target, "from a child process\n")  # the whole line: a pipe may deliver it in two reads
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
    # The pumps copy the pipe asynchronously: a copy tries (and fails) once
    # the line has reached the local log.
    deadline, refused = time.time() + 5, None
    while refused is None and time.time() < deadline:
        refused = keeper.copy()
        time.sleep(0.05)
    assert refused is not None and "403 Forbidden" in refused, refused
    keeper._fs = real
    keeper.close()
    assert (tmp_path / "attempt-1" / driverlog.LOG_FILE).read_text() == "kept later\n"
    assert "could not copy the driver log" in capfd.readouterr().err


def _child(code, tmp_path, **kwargs):
    """Run code in a fresh Python with the trainer on its path and STORAGE set."""
    from conftest import TRAINER_DIR

    prelude = f"import os, sys\nsys.path.insert(0, {TRAINER_DIR!r})\nimport driverlog\nSTORAGE = {str(tmp_path)!r}\n"
    return subprocess.Popen([sys.executable, "-c", prelude + code], **kwargs)


def test_a_failing_local_log_never_blocks_the_driver(tmp_path):
    """The local copy fails (here every write: /dev/full, ENOSPC); the pumps go
    on draining, so the driver's output still reaches its real standard output
    instead of blocking once a pipe's 64 KiB are full."""
    code = (
        "keeper = driverlog.Keeper(STORAGE, 'attempt-1', every=3600)\n"
        "keeper._log = open('/dev/full', 'wb', buffering=0)\n"
        "for _ in range(64):\n"
        "    os.write(1, b'x' * 4095 + b'\\n')\n"
        "os.write(2, b'not blocked\\n')\n"
        "keeper.close()\n"
    )
    proc = _child(code, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the driver blocked writing to its standard output")
    assert proc.returncode == 0, err
    assert len(out) == 64 * 4096 and b"not blocked" in err
    assert b"raydrop: cannot keep the driver's output: OSError" in err, err


def test_output_to_a_regular_file_is_read_there_and_nothing_is_lost_on_sigkill(tmp_path):
    """Under `ray job submit` the driver's output is one regular file, Ray's job
    log: the keeper copies that file and puts no pipe in between, so a driver
    killed at once leaves all it wrote in Ray's log."""
    code = (
        "keeper = driverlog.Keeper(STORAGE, 'attempt-1', every=3600)\n"
        "for i in range(2000):\n"
        "    os.write(1, b'line %04d ' % i + b'.' * 90 + b'\\n')\n"
        "assert keeper.copy() is None\n"
        "os.write(2, b'last words\\n')\n"
        "os.kill(os.getpid(), 9)\n"
    )
    log = tmp_path / "job-driver.log"
    with open(log, "ab") as f:  # as Ray's job supervisor opens it
        proc = _child(code, tmp_path, stdout=f, stderr=subprocess.STDOUT)
        proc.wait(timeout=60)
    text = log.read_text()
    assert "line 1999" in text and text.endswith("last words\n"), text[-300:]
    kept = (tmp_path / "attempt-1" / driverlog.LOG_FILE).read_text()
    assert kept.startswith("line 0000") and kept.endswith("line 1999 " + "." * 90 + "\n")


class _CountingFs:
    """The real filesystem, counting the bytes each copy uploads."""

    def __init__(self, fs):
        self.fs = fs
        self.uploaded = 0

    def create_dir(self, *args, **kwargs):
        return self.fs.create_dir(*args, **kwargs)

    def open_output_stream(self, path):
        counter = self
        stream = self.fs.open_output_stream(path)

        class Counted:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

            def write(self, data):
                counter.uploaded += len(data)
                return stream.write(data)

        return Counted()


def test_the_copy_is_cut_into_parts_and_uploads_only_what_is_new(tmp_path, capfd):
    keeper = driverlog.Keeper(str(tmp_path), "attempt-1", every=3600, part_bytes=1000)
    fs = keeper._fs = _CountingFs(keeper._fs)
    lines = [b"line %03d %s\n" % (i, b"-" * 40) for i in range(100)]  # 50 bytes each, 5000 in all
    for line in lines[:60]:
        os.write(1, line)
    folder = tmp_path / "attempt-1"
    _copied(keeper, folder / driverlog.LOG_FILE, lines[59].decode())
    os.write(1, b"".join(lines[60:]))
    _copied(keeper, folder / driverlog.LOG_FILE, lines[99].decode())
    fs.uploaded = 0
    os.write(1, b"one more line\n")
    _copied(keeper, folder / driverlog.LOG_FILE, "one more line")
    # Not the whole 5 kB log again: what came after the last sealed part (and
    # the part that line sealed).
    assert fs.uploaded <= 2 * 1000, fs.uploaded
    keeper.close()
    parts = sorted(p.name for p in folder.iterdir() if p.name != driverlog.LOG_FILE)
    assert parts == [driverlog.part_name(i) for i in range(1, len(parts) + 1)] and len(parts) >= 4, parts
    sizes = [(folder / p).stat().st_size for p in parts]
    assert all(s <= 1000 and s % 50 == 0 for s in sizes), sizes  # cut at line ends
    whole = b"".join((folder / p).read_bytes() for p in parts + [driverlog.LOG_FILE])
    assert whole == b"".join(lines) + b"one more line\n"


def test_a_slow_earlier_copy_never_lands_after_the_last(tmp_path, capfd):
    import threading

    keeper = driverlog.Keeper(str(tmp_path), "attempt-1", every=3600)
    real = keeper._fs
    target = tmp_path / "attempt-1" / driverlog.LOG_FILE

    class SlowOnce:
        """Publishes each object whole when it is closed, as an object store
        does; the first upload is stuck on the network for a while."""

        slow = True

        def create_dir(self, *args, **kwargs):
            return real.create_dir(*args, **kwargs)

        def open_output_stream(self, path):
            slow, SlowOnce.slow = SlowOnce.slow, False
            chunks = []

            class Out:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    if slow:
                        time.sleep(1.5)
                    with real.open_output_stream(path) as out:
                        out.write(b"".join(chunks))

                def write(self, data):
                    chunks.append(bytes(data))

            return Out()

    os.write(1, b"early\n")
    assert "early" in _copied(keeper, target, "early")
    os.write(1, b"middle\n")
    keeper._fs = SlowOnce()
    earlier = threading.Thread(target=keeper.copy)
    earlier.start()
    time.sleep(0.3)
    os.write(1, b"last\n")
    keeper.close()
    earlier.join()
    assert target.read_text().endswith("last\n"), target.read_text()
