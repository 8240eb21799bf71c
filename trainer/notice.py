"""Checkpoint on notice: a node about to be reclaimed gives the trainer time to save.

GKE stops the pods of a reclaimed Spot VM through the kubelet's graceful node
shutdown (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms):
each container's preStop hook runs, then it gets SIGTERM, within the grace
period. Ray does not pass SIGTERM to a training worker's loop, so a notice
reaches the workers two ways, and they look for both after every optimizer
step:

* a GPU worker pod's preStop hook creates a file in its own container
  (RAYDROP_NOTICE_FILE, default /tmp/raydrop/notice): the workers on that
  node see it;
* the driver, on its own SIGTERM (`ray job stop`, a deleted RayJob), puts a
  key in Ray's internal key-value store, which lives in the head's GCS and is
  visible from every node. The driver runs on the CPU head pod and shares no
  filesystem with the GPU workers, so a file would reach none of them; rank 0
  reads the key.

The workers agree through one all-reduce, so all of them save the same step
and stop together; the driver then writes a mark with status "preempted", and
the pipeline's next attempt resumes from that checkpoint, losing at most the
step that was running when the notice came. A notice that comes once the last
step is done is ignored: the run has finished.

`ray job stop` kills the driver RAY_JOB_STOP_WAIT_TIME_S (Ray's default: 3)
seconds after its SIGTERM; the RayJob's runtime env raises it to
STOP_WAIT_S so that the workers can save and the driver can write the mark.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

# Where a worker pod's preStop hook leaves the notice, in every worker container.
NOTICE_ENV = "RAYDROP_NOTICE_FILE"
DEFAULT_NOTICE = "/tmp/raydrop/notice"
# The metric the last report carries when the run stopped on a notice.
PREEMPTED_KEY = "preempted_at_step"
# The internal KV namespace of the driver's notices; each attempt has its own key.
KV_NAMESPACE = b"raydrop-notice"
# What the pipeline sets RAY_JOB_STOP_WAIT_TIME_S to (pkg/manifests.StopWaitSeconds).
STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
STOP_WAIT_S = 120


def path() -> str:
    return os.environ.get(NOTICE_ENV) or DEFAULT_NOTICE


def give(where: str | None = None) -> None:
    """Create the notice file (what the preStop hook does)."""
    where = where or path()
    os.makedirs(os.path.dirname(where), exist_ok=True)
    with open(where, "a", encoding="utf-8"):
        pass
    os.utime(where)


def new_key() -> str:
    """A key of the driver's notice for one attempt: the Ray cluster outlives
    attempts, and an earlier attempt's notice must not stop a later one."""
    return "attempt-" + uuid.uuid4().hex


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def put(key: str) -> None:
    """Give every worker of the attempt notice through Ray's GCS."""
    _kv()._internal_kv_put(key.encode(), b"1", overwrite=True, namespace=KV_NAMESPACE)


def given(key: str) -> bool:
    return _kv()._internal_kv_get(key.encode(), namespace=KV_NAMESPACE) is not None


def remove(key: str) -> None:
    try:
        _kv()._internal_kv_del(key.encode(), namespace=KV_NAMESPACE)
    except Exception:  # noqa: BLE001 - Ray is gone; so is its store
        pass


class OnSigterm:
    """Turns the driver's SIGTERM into a notice to every worker instead of an exit.

    The handler itself only writes one byte to a pipe: a Python signal handler
    runs in the main thread between two bytecodes, possibly inside a print() or
    a call into Ray, so printing there can raise "reentrant call" and calling
    Ray can deadlock. A thread reads the pipe, puts the key and logs. Install it
    after ray.init(), which sets its own SIGTERM handler (an immediate exit).
    """

    def __init__(self, key: str, log) -> None:
        self.key = key
        self._log = log
        self._read, self._write = os.pipe()
        # A handler must never block: once the pipe is full, notice is on its way.
        os.set_blocking(self._write, False)
        self.received = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="raydrop-notice", daemon=True)
        self._thread.start()
        signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum, frame):  # noqa: ARG002 - the signal API's signature
        try:
            os.write(self._write, b"t")
        except OSError:
            pass  # the pipe is full: a notice is already on its way

    def _serve(self) -> None:
        try:
            os.read(self._read, 1)  # blocks until the first SIGTERM; later ones change nothing
        except OSError:
            return
        self.received.set()
        try:
            put(self.key)
            self._log("SIGTERM: gave the workers notice through Ray; they save a checkpoint and stop")
        except Exception as exc:  # noqa: BLE001 - nothing else can deliver it
            self._log(f"SIGTERM: could not give the workers notice: {type(exc).__name__}: {exc}")


class Watch:
    """Whether any worker has the notice: one all-reduce of a flag per step.

    Every worker looks for its own node's file; the worker given kv_key (rank
    0) also asks Ray's store for the driver's notice, one small GCS read per
    optimizer step.
    """

    def __init__(self, where: str | None = None, device=None, kv_key: str | None = None,
                 tell_key: str | None = None) -> None:
        self.path = where or path()
        self.device = device
        self.kv_key = kv_key
        # A worker that finds its node's notice file puts the attempt's key
        # (tell_key) in Ray's store at once, before the all-reduce and the
        # save: if the node dies before the save ends, the driver still
        # knows a notice came, and its failed mark says so (noticeSeen), for
        # the pipeline to count the attempt as preempted.
        self.tell_key = tell_key
        self.told = False
        # A notice file older than the attempt was for an earlier one on this node.
        self.since = time.time()

    def _seen(self) -> bool:
        try:
            if os.stat(self.path).st_mtime >= self.since - 1:
                self._tell()
                return True
        except FileNotFoundError:
            pass
        return bool(self.kv_key) and given(self.kv_key)

    def _tell(self) -> None:
        if self.told or not self.tell_key:
            return
        self.told = True
        try:
            put(self.tell_key)
        except Exception:  # noqa: BLE001 - the all-reduce still stops every worker
            pass

    def due(self) -> bool:
        seen = self._seen()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            import torch

            flag = torch.tensor([1 if seen else 0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            seen = bool(flag.item())
        return seen
