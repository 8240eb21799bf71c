"""The driver's log, kept beside the run: <storage-path>/<experiment-name>/driver.log.

Everything the Ray job's driver prints goes to its standard output and error: its own
lines, and the Ray Train workers' lines, which Ray forwards to the driver. That is what
`ray job logs` shows while the cluster is up, and it goes with the head pod. So the
driver copies it into the run's experiment folder every `every` seconds while it has
grown, and once more when the driver ends, whatever ended it: `raydrop logs` reads it
from there once the cluster has scaled down. A copy that fails is reported on the real
standard error and tried again next time; it never fails the run.
"""

from __future__ import annotations

import os
import posixpath
import sys
import tempfile
import threading
from typing import Optional

import result

LOG_FILE = "driver.log"
DEFAULT_EVERY = 15.0


class Keeper:
    """Tees the process's standard output and error (file descriptors 1 and 2, so the
    lines Ray's own components write there are kept too) into a local file, and copies
    that file to the storage path."""

    def __init__(self, storage_path: str, experiment_name: str, every: float = DEFAULT_EVERY) -> None:
        storage_path = result.normalize_storage_path(storage_path)
        self.uri = result.join(storage_path, experiment_name, LOG_FILE)
        self._fs, base = result.filesystem(storage_path)
        self._dir = posixpath.join(base, experiment_name)
        self._target = posixpath.join(self._dir, LOG_FILE)
        fd, self._local = tempfile.mkstemp(prefix="raydrop-driver-", suffix=".log")
        self._log = os.fdopen(fd, "wb", buffering=0)
        self._lock = threading.Lock()
        self._every = every
        self._copied = -1
        self._stop = threading.Event()
        self._pumps = []
        self._saved = {}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for target in (1, 2):
            read_end, write_end = os.pipe()
            self._saved[target] = os.dup(target)
            os.dup2(write_end, target)
            os.close(write_end)
            pump = threading.Thread(target=self._pump, args=(read_end, self._saved[target]),
                                    name=f"raydrop-driver-log-{target}", daemon=True)
            pump.start()
            self._pumps.append(pump)
        self._thread = threading.Thread(target=self._loop, name="raydrop-driver-log", daemon=True)
        self._thread.start()

    def _pump(self, read_end: int, original: int) -> None:
        """Copy what is written to one descriptor to where it went before, and to the log."""
        with os.fdopen(read_end, "rb", buffering=0) as src:
            while True:
                chunk = src.read(65536)
                if not chunk:
                    return
                os.write(original, chunk)
                with self._lock:
                    self._log.write(chunk)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            self.copy()

    def copy(self) -> Optional[str]:
        """Copy the log if it grew since the last copy; returns an error text, or None."""
        try:
            with self._lock:
                size = os.path.getsize(self._local)
            if size == self._copied:
                return None
            with open(self._local, "rb") as f:
                data = f.read(size)
            self._fs.create_dir(self._dir, recursive=True)
            # An object store publishes the object only once it is whole, so a
            # reader never sees a torn copy; each copy holds the last one.
            with self._fs.open_output_stream(self._target) as out:
                out.write(data)
            self._copied = size
            return None
        except Exception as exc:  # noqa: BLE001 - the log is kept on a best-effort basis
            text = result.error_text(exc)
            os.write(self._saved.get(2, 2), f"raydrop: could not copy the driver log to {self.uri}: {text}\n".encode())
            return text

    def close(self) -> None:
        """Stop teeing and copy the log a last time."""
        self._stop.set()
        self._thread.join(timeout=self._every + 5)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream has nothing left
                pass
        # Putting the original descriptors back closes the pipes' last write
        # ends this process holds; a child that inherited one keeps its pump
        # going, so the pumps get a moment, not forever.
        for target, saved in self._saved.items():
            os.dup2(saved, target)
        for pump in self._pumps:
            pump.join(timeout=2)
        self.copy()
        self._log.close()
        for saved in self._saved.values():
            os.close(saved)
        try:
            os.unlink(self._local)
        except OSError:
            pass
