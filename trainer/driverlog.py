"""The driver's log, kept beside the run: <storage-path>/<experiment-name>/driver.log.

Everything the Ray job's driver prints goes to its standard output and error: its own
lines, and the Ray Train workers' lines, which Ray forwards to the driver. That is what
`ray job logs` shows while the cluster is up, and it goes with the head pod. So the
driver copies it into the run's experiment folder every `every` seconds while it has
grown, and once more when the driver ends: `raydrop logs` reads it from there once the
cluster has scaled down. A copy that fails is reported on the real standard error and
tried again next time; it never fails the run.

Under `ray job submit` (and KubeRay's RayJob) the job supervisor points the driver's
standard output and error at one regular file, Ray's job log; the keeper then only reads
that file, so nothing stands between the driver and the log Ray keeps, and a driver
killed or crashing loses nothing. Elsewhere (a terminal, a pipe) it tees file
descriptors 1 and 2 into a local file through two pump threads that go on draining
whatever fails, so a print never blocks on them.

The copy is bounded: once the log passes `part_bytes` past the last cut, the part before
is written once, at a line boundary, as driver.log.part-00001, -00002, ... (oldest
first), and driver.log holds what came after it; each copy uploads at most about two
parts, not the whole log again.
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys
import tempfile
import threading
from typing import Optional

import result

LOG_FILE = "driver.log"
DEFAULT_EVERY = 15.0
PART_BYTES = 16 << 20


def part_name(index: int) -> str:
    """The object name of the index-th (from 1) sealed part of the log."""
    return f"{LOG_FILE}.part-{index:05d}"


def _same_regular_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return stat.S_ISREG(sa.st_mode) and (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class Keeper:
    """Keeps the process's standard output and error (file descriptors 1 and 2, so the
    lines Ray's own components write there are kept too) and copies them to the storage
    path."""

    def __init__(self, storage_path: str, experiment_name: str, every: float = DEFAULT_EVERY,
                 part_bytes: int = PART_BYTES) -> None:
        storage_path = result.normalize_storage_path(storage_path)
        self.uri = result.join(storage_path, experiment_name, LOG_FILE)
        self._fs, base = result.filesystem(storage_path)
        self._dir = posixpath.join(base, experiment_name)
        self._every = every
        self._part_bytes = part_bytes
        self._copy_lock = threading.Lock()  # one copy at a time: an older one never lands last
        self._copied = -1  # the source's size at the last successful copy
        self._sealed = 0  # bytes of the source written as sealed parts
        self._parts = 0
        self._stop = threading.Event()
        self._pumps = []
        self._saved = {}
        self._local = None
        self._lock = threading.Lock()
        self._pump_error = None
        self.mode = self._follow_regular_file() or self._tee()
        self._thread = threading.Thread(target=self._loop, name="raydrop-driver-log", daemon=True)
        self._thread.start()

    def _follow_regular_file(self) -> Optional[str]:
        if not _same_regular_file(1, 2):
            return None
        try:
            # A new open file description of the same file, for reading: the
            # driver's own descriptor is write-only (append).
            self._source = os.open("/proc/self/fd/1", os.O_RDONLY)
        except OSError:
            return None
        return "file"

    def _tee(self) -> str:
        fd, self._local = tempfile.mkstemp(prefix="raydrop-driver-", suffix=".log")
        self._log = os.fdopen(fd, "wb", buffering=0)
        self._source = os.open(self._local, os.O_RDONLY)
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
        return "tee"

    def _pump(self, read_end: int, original: int) -> None:
        """Copy what is written to one descriptor to where it went before, and to the
        local log. Neither failing (EPIPE, ENOSPC, ...) stops the draining: a pump that
        stopped would leave every later print blocked once the pipe is full."""
        try:
            while True:
                try:
                    chunk = os.read(read_end, 65536)
                except InterruptedError:
                    continue
                if not chunk:
                    return
                try:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(original, view):]
                except OSError as exc:
                    self._note(exc, "forward the driver's output")
                try:
                    with self._lock:
                        self._log.write(chunk)
                except (OSError, ValueError) as exc:
                    self._note(exc, "keep the driver's output")
        except BaseException as exc:  # noqa: BLE001 - reading the pipe itself failed: nothing left to drain
            self._note(exc, "read the driver's output")
        finally:
            os.close(read_end)

    def _note(self, exc: BaseException, what: str) -> None:
        """Report a pump's first failure, on the original standard error if it still works."""
        if self._pump_error is not None:
            return
        self._pump_error = f"{type(exc).__name__}: {exc}"
        try:
            os.write(self._saved.get(2, 2), f"raydrop: cannot {what}: {self._pump_error}\n".encode())
        except OSError:
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            self.copy()

    def _write(self, name: str, data: bytes) -> None:
        # An object store publishes the object only once it is whole, so a
        # reader never sees a torn copy; each copy replaces the last one.
        with self._fs.open_output_stream(posixpath.join(self._dir, name)) as out:
            out.write(data)

    def copy(self) -> Optional[str]:
        """Copy the log if it grew since the last copy; returns an error text, or None."""
        with self._copy_lock:
            try:
                size = os.fstat(self._source).st_size
                if size == self._copied:
                    return None
                self._fs.create_dir(self._dir, recursive=True)
                while size - self._sealed > self._part_bytes:
                    data = os.pread(self._source, self._part_bytes, self._sealed)
                    cut = data.rfind(b"\n") + 1 or len(data)  # at a line boundary when there is one
                    self._write(part_name(self._parts + 1), data[:cut])
                    self._parts += 1
                    self._sealed += cut
                self._write(LOG_FILE, os.pread(self._source, size - self._sealed, self._sealed))
                self._copied = size
                return None
            except Exception as exc:  # noqa: BLE001 - the log is kept on a best-effort basis
                text = result.error_text(exc)
                try:
                    os.write(self._saved.get(2, 2),
                             f"raydrop: could not copy the driver log to {self.uri}: {text}\n".encode())
                except OSError:
                    pass
                return text

    def close(self) -> None:
        """Stop keeping and copy the log a last time (after any copy still running)."""
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
        os.close(self._source)
        if self._local is not None:
            self._log.close()
            try:
                os.unlink(self._local)
            except OSError:
                pass
        for saved in self._saved.values():
            os.close(saved)
