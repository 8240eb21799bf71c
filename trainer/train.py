"""raydrop trainer entry point: python train.py --flag value ...

Runs LoRA fine-tuning of Gemma 3 on image+text product descriptions with
TRL's SFTTrainer under Ray Train's TorchTrainer (Train V1 storage layout),
then writes <storage-path>/<experiment-name>/raydrop_result.json. Exit code
0 when training succeeded, 1 when it failed, 2 on invalid flags, 3 when a
preemption notice stopped it after saving a checkpoint (notice.py).
"""

from __future__ import annotations

import os
import sys
import time

# Ray 2.48 writes the V1 layout (trial folder, result.json) unless Train V2 is
# switched on; the pipeline reads that layout, so pin it.
os.environ["RAY_TRAIN_V2_ENABLED"] = "0"
# Ray's tqdm support replaces builtins.print in the driver the first time a
# worker's progress bar reaches it; a function Ray pickles after that and
# which uses print then fails ("Can't pickle <built-in function print>: it's
# not the same object as builtins.print"), a race a busy head loses. print
# stays the builtin.
os.environ["RAY_TQDM_PATCH_PRINT"] = "0"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cli  # noqa: E402
import driverlog  # noqa: E402
import heartbeat  # noqa: E402
import notice  # noqa: E402
import result  # noqa: E402
import weights  # noqa: E402

# Modules whose code the Ray workers need. They are pickled by value, so the
# workers do not depend on the code directory being on their import path.
WORKER_MODULES = ("cli", "data", "heartbeat", "modeling", "notice", "result", "samples", "sft", "weights", "worker")

# Ray Train's default process group timeout is 30 minutes: a collective that
# never completes holds every GPU that long before its watchdog aborts it. The
# run's stall window (limits.stallAfter, in the runtime env) bounds it instead,
# plus this margin, which covers the ranks' skew in loading the model and the
# data before the first step (one rank per node downloads while the others
# wait in a barrier, a collective too).
COLLECTIVE_MARGIN_S = 600
RAY_TRAIN_TIMEOUT_S = 1800


def collective_timeout_s(env=None) -> int:
    """The process group's timeout: limits.stallAfter plus COLLECTIVE_MARGIN_S, or Ray
    Train's default when the runtime env names no stall window."""
    env = os.environ if env is None else env
    try:
        after = float(env.get(heartbeat.STALL_AFTER_ENV) or 0)
    except ValueError:
        after = 0
    if after <= 0:
        return RAY_TRAIN_TIMEOUT_S
    return int(after) + COLLECTIVE_MARGIN_S


def _log(msg: str) -> None:
    print(f"raydrop: {msg}", flush=True)


def run(args) -> int:
    import ray
    import ray.cloudpickle
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    import worker

    for name in WORKER_MODULES:
        ray.cloudpickle.register_pickle_by_value(sys.modules[__import__(name).__name__])
    # ray.init() installs a SIGTERM handler that exits at once; the notice
    # handler replaces it, so a SIGTERM saves a checkpoint first.
    ray.init()
    sigterm = notice.OnSigterm(notice.new_key(), _log)
    stop_wait = os.environ.get(notice.STOP_WAIT_ENV)
    if stop_wait is None or not stop_wait.isdigit() or int(stop_wait) < notice.STOP_WAIT_S:
        _log(f"{notice.STOP_WAIT_ENV}={stop_wait}: `ray job stop` may kill this driver before the workers "
             f"have saved on its SIGTERM (the pipeline sets {notice.STOP_WAIT_S})")

    # The model is staged (or waited for) before the workers start. A failure here
    # writes no completion mark: the attempt then ends as a job without one, which
    # the pipeline retries (a Hub or bucket hiccup), where a failed mark would end
    # the run as the training code's own failure. A snapshot that cannot be
    # trained from at all (ValueError: no weights) is that, and gets its mark.
    stage_start = time.monotonic()
    try:
        weights.ready(args, _log)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - retried by the pipeline, see above
        _log(f"could not stage the model at {args.staged_model}: {result.error_text(exc)}; "
             "no completion mark, so the pipeline retries the attempt")
        return 1
    stage_s = time.monotonic() - stage_start

    storage_path = result.normalize_storage_path(args.storage_path)
    config = dict(vars(args))
    config["stage_s"] = stage_s
    config["storage_path"] = storage_path
    # The driver's SIGTERM reaches the workers through Ray's store under this
    # key; each worker pod's own notice file is where its environment says.
    config["notice_key"] = sigterm.key

    scaling = ScalingConfig(
        num_workers=args.num_workers,
        use_gpu=args.use_gpu,
        accelerator_type=args.accelerator_type or None,
    )
    run_config = RunConfig(
        name=args.experiment_name,
        storage_path=storage_path,
        checkpoint_config=CheckpointConfig(num_to_keep=None),
        failure_config=FailureConfig(max_failures=0),
    )
    timeout_s = collective_timeout_s()
    trainer = TorchTrainer(
        worker.train_func,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=run_config,
        torch_config=TorchConfig(timeout_s=timeout_s),
    )
    _log(f"a collective waits at most {timeout_s} s (the process group's timeout)")

    status, error, trial_hint = "failed", None, None
    try:
        _log(f"run {args.run_id}: {args.num_workers} workers, storage {storage_path}/{args.experiment_name}")
        res = trainer.fit()
        trial_hint = os.path.basename(str(res.path).rstrip("/")) if res.path else None
        stopped_at = (res.metrics or {}).get(notice.PREEMPTED_KEY)
        if res.error is not None:
            error = result.error_text(res.error)
        elif stopped_at is not None:
            status = "preempted"
            error = f"preemption notice after step {stopped_at}: saved a checkpoint of it and stopped"
        else:
            status = "succeeded"
    except BaseException as exc:  # the mark must be written whatever happened
        error = result.error_text(exc)
    finally:
        # Whether a notice reached the attempt (the driver's SIGTERM, or a
        # worker's notice file, which that worker put in Ray's store): a
        # failed mark with it is a node reclaimed before the save ended.
        seen = sigterm.received.is_set() or _notice_given(sigterm.key)
        doc = result.build(storage_path, args.experiment_name, args.run_id, status, error, trial_hint, notice_seen=seen)
        where = result.write(storage_path, args.experiment_name, doc)
        _log(f"{status}; wrote {where}")
        _announce(args, where)
        notice.remove(sigterm.key)
    return {"succeeded": 0, "preempted": 3}.get(status, 1)


def _notice_given(key: str) -> bool:
    try:
        return notice.given(key)
    except Exception as exc:  # noqa: BLE001 - Ray is gone; the mark must still be written
        _log(f"could not ask Ray's store for a notice: {result.error_text(exc)}")
        return False


def _announce(args, mark: str) -> None:
    """Announce the mark (--mark-notice); without the notice the pipeline still finds the
    mark on its next sweep, so a failure here is logged, not fatal."""
    if not args.mark_notice:
        return
    try:
        result.announce(args.mark_notice, mark)
        _log(f"announced at {args.mark_notice}")
    except Exception as exc:  # noqa: BLE001 - the sweep reads the mark anyway
        _log(f"could not write the mark notice {args.mark_notice}: {result.error_text(exc)}")


def main(argv=None) -> int:
    args = cli.parse_args(argv)
    keeper = None
    try:
        keeper = driverlog.Keeper(args.storage_path, args.experiment_name)
    except Exception as exc:  # noqa: BLE001 - the run goes on without a kept log
        _log(f"cannot keep the driver log: {result.error_text(exc)}")
    try:
        return _main(args)
    finally:
        _disconnect_ray()
        if keeper is not None:
            keeper.close()


def _disconnect_ray() -> None:
    """Disconnect from Ray before the log is kept for the last time. Ray holds back a
    worker's line that another worker printed too (its log deduplication) and prints
    what it still holds when it disconnects; left to Ray's own exit handler, those lines
    come after the keeper's last copy and never reach driver.log."""
    ray = sys.modules.get("ray")
    if ray is None:
        return
    try:
        ray.shutdown()
    except Exception as exc:  # noqa: BLE001 - the log is kept on a best-effort basis
        _log(f"could not disconnect from Ray: {result.error_text(exc)}")


def _main(args) -> int:
    try:
        return run(args)
    except BaseException as exc:
        # Failures before fit() (Ray unreachable, bad storage path) still get a mark when possible.
        try:
            doc = result.failed_early(args.storage_path, args.experiment_name, args.run_id, result.error_text(exc))
            _announce(args, result.write(args.storage_path, args.experiment_name, doc))
        except Exception:
            pass
        _log(f"failed: {result.error_text(exc)}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
