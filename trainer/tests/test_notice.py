"""The driver's SIGTERM handler, in one process (no Ray)."""

from __future__ import annotations

import subprocess
import sys

from conftest import TRAINER_DIR

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
