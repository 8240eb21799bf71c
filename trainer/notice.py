"""Checkpoint on notice: a node about to be reclaimed gives the trainer time to save.

GKE stops the pods of a reclaimed Spot VM through the kubelet's graceful node
shutdown (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms):
each container's preStop hook runs, then it gets SIGTERM, within the grace
period. Ray does not pass SIGTERM to a training worker's loop, so the notice
is a file: the worker pod's preStop hook (and the driver, on its own
SIGTERM) creates it, and every worker looks for it after each optimizer step.
The workers agree through one all-reduce, so all of them save the same step
and stop together; the driver then writes a mark with status "preempted", and
the pipeline's next attempt resumes from that checkpoint, losing at most the
step that was running when the notice came.
"""

from __future__ import annotations

import os
import signal
import time

# Where the notice is: the same path in every container of the cluster.
NOTICE_ENV = "RAYDROP_NOTICE_FILE"
DEFAULT_NOTICE = "/tmp/raydrop/notice"
# The metric the last report carries when the run stopped on a notice.
PREEMPTED_KEY = "preempted_at_step"


def path() -> str:
    return os.environ.get(NOTICE_ENV) or DEFAULT_NOTICE


def give(where: str | None = None) -> None:
    """Create the notice file (what the preStop hook does)."""
    where = where or path()
    os.makedirs(os.path.dirname(where), exist_ok=True)
    with open(where, "a", encoding="utf-8"):
        pass
    os.utime(where)


def on_sigterm(log) -> None:
    """Turn the driver's SIGTERM into a notice instead of an exit, so the
    workers on this node save and stop. Install it after ray.init(), which sets
    its own handler (an immediate exit)."""

    def handler(signum, frame):  # noqa: ARG001 - the signal API's signature
        give()
        log(f"SIGTERM: gave the workers notice ({path()}); they save a checkpoint and stop")

    signal.signal(signal.SIGTERM, handler)


class Watch:
    """Whether any worker has the notice: one all-reduce of a flag per step."""

    def __init__(self, where: str | None = None, device=None) -> None:
        self.path = where or path()
        self.device = device
        # A notice older than the attempt was for an earlier one on this node.
        self.since = time.time()

    def _seen(self) -> bool:
        try:
            return os.stat(self.path).st_mtime >= self.since - 1
        except FileNotFoundError:
            return False

    def due(self) -> bool:
        seen = self._seen()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            import torch

            flag = torch.tensor([1 if seen else 0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            seen = bool(flag.item())
        return seen
