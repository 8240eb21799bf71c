"""The training loop every Ray Train worker runs.

Only rank 0 persists checkpoints: the other ranks report the same number of
results (Ray Train V1 requires it) without a checkpoint. Checkpoints hold the
adapter, optimizer, scheduler, RNG state, trainer_state.json and the
processor files, so a run can continue from one with --resume-from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
import time
from typing import Any, Dict, Optional, Tuple

import data
import heartbeat
import modeling
import notice
import samples
import sft
import weights
from cli import effective_lr_scheduler

log = logging.getLogger("raydrop.trainer")

CHECKPOINT_SUBDIR = "checkpoint"  # Ray's checkpoint_00000N/<this>/ holds the HF files
TRAINER_STATE = "trainer_state.json"
# The pod's local-SSD volume (the pipeline sets it); node-local copies go there.
SCRATCH_ENV = "RAYDROP_SCRATCH"


def checkpoint_dir_name(index: int) -> str:
    """Ray Train V1's name for the index-th checkpoint of a trial."""
    return f"checkpoint_{index:06d}"


def _optimizer_step(optimizer) -> Optional[int]:
    inner = getattr(optimizer, "optimizer", optimizer)
    steps = []
    for state in getattr(inner, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is not None:
            steps.append(int(step.item() if hasattr(step, "item") else step))
    return max(steps) if steps else None


def _make_callback_class():
    import ray.train
    from transformers import TrainerCallback

    class RaydropReportCallback(TrainerCallback):
        """Reports metrics to Ray at each log and save; rank 0 attaches checkpoints.

        A log step that is also a save step is reported once, by the save.
        The final summary (train_runtime, train_loss, ...) is the last report.
        """

        def __init__(self, data_stats: Dict[str, Any], resume_step: Optional[int] = None, evaluate=None,
                     watch=None, startup: Optional[Dict[str, float]] = None, heartbeat=None) -> None:
            self.metrics: Dict[str, Any] = {}
            # How this worker started (STARTUP_KEY), sent once, with the first
            # report after the first optimizer step, which stamps first_step_at.
            self.startup = dict(startup) if startup else None
            self.saved = 0
            self.latest: Optional[str] = None
            self.start_step = 0
            self.resume: Dict[str, Any] = {}
            self.data_stats = dict(data_stats)
            self.resume_step = resume_step
            # Every checkpoint is evaluated on the held-out rows just before it
            # is reported, on every rank (the evaluation reduces across them),
            # so its eval_loss is its own and never an earlier one's.
            self.evaluate = evaluate
            # A preemption notice (notice.py): save this step and stop.
            self.watch = watch
            self.preempted_at: Optional[int] = None
            self.saved_step: Optional[int] = None
            # The rank's heartbeat (heartbeat.py): each step's end, and what
            # it does between two steps.
            self.heartbeat = heartbeat

        def on_step_end(self, args, state, control, **kwargs):
            if self.heartbeat is not None:
                self.heartbeat.step(state.global_step)
            if self.startup is not None and "first_step_at" not in self.startup:
                self.startup["first_step_at"] = time.time()
            if state.global_step >= state.max_steps:
                # The last step is done: the run ends here with its own save,
                # so a notice now changes nothing, and is not looked for (every
                # rank skips the all-reduce at the same step).
                control.should_log = True
                return control
            if self.watch is not None and self.preempted_at is None and self.watch.due():
                self.preempted_at = state.global_step
                control.should_save = True
                control.should_training_stop = True
                # Logged now, every rank's loss since the last log goes into
                # the all-ranks mean; otherwise transformers adds rank 0's own
                # remainder to train_loss.
                control.should_log = True
                if state.is_world_process_zero:
                    log.warning("preemption notice after step %d: saving a checkpoint and stopping", state.global_step)
            return control

        def on_epoch_end(self, args, state, control, **kwargs):
            # DefaultFlowCallback (which runs first) asks for a save at every
            # epoch's end with save_strategy "epoch", also when the loop left
            # the epoch early on a notice and has just saved this very step:
            # a second evaluation and upload inside the preStop hook's grace.
            if control.should_save and self.saved_step == state.global_step:
                control.should_save = False
            return control

        def _doing(self, activity: str) -> None:
            if self.heartbeat is not None:
                self.heartbeat.note(activity)

        def _report(self, metrics: Dict[str, Any], checkpoint=None) -> None:
            metrics = dict(metrics)
            metrics["latest_checkpoint_dir_name"] = self.latest
            metrics.update(self.data_stats)
            if self.resume:
                metrics.update(self.resume)
            if self.startup is not None and "first_step_at" in self.startup:
                metrics[STARTUP_KEY] = self.startup
                self.startup = None
            ray.train.report(metrics, checkpoint=checkpoint)

        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            if self.resume_step is not None and state.global_step != self.resume_step:
                raise RuntimeError(
                    f"resumed at step {state.global_step} (the copied checkpoint's {TRAINER_STATE}), but Ray Train "
                    f"reported the checkpoint this attempt was told to resume from at step {self.resume_step}: "
                    "the copy is not that checkpoint"
                )
            self.start_step = state.global_step
            if state.global_step > 0:
                self.resume = {
                    "resumed_from_step": state.global_step,
                    "resumed_optimizer_step": _optimizer_step(optimizer),
                    "resumed_scheduler_step": getattr(lr_scheduler, "last_epoch", None),
                }

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if any(k.startswith("eval_") for k in logs):
                return  # the evaluation on_save runs; it goes with the checkpoint
            if "train_runtime" in logs:
                summary = dict(logs)
                steps = state.global_step - self.start_step
                if steps > 0 and "train_loss" in logs:
                    # transformers divides this run's loss total by the global step,
                    # which understates it after a resume; divide by this run's steps.
                    summary["train_loss"] = logs["train_loss"] * state.global_step / steps
                summary["train_steps"] = steps
                summary["global_step"] = state.global_step
                if self.preempted_at is not None:
                    summary[notice.PREEMPTED_KEY] = self.preempted_at
                self._report({**self.metrics, **summary, "step": state.global_step, "epoch": state.epoch})
                return
            self.metrics.update(logs)
            self.metrics["step"] = state.global_step
            self.metrics["epoch"] = state.epoch
            if not control.should_save:
                self._report(self.metrics)

        def on_save(self, args, state, control, **kwargs):
            self.saved_step = state.global_step
            src = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            metrics = {**self.metrics, "step": state.global_step, "epoch": state.epoch}
            if self.evaluate is not None:
                self._doing("evaluating")
                metrics.update(self.evaluate())
            self._doing("saving")
            name = checkpoint_dir_name(self.saved)
            self.saved += 1
            if state.is_world_process_zero:
                staging = tempfile.mkdtemp(prefix="report-", dir=args.output_dir)
                try:
                    os.replace(src, os.path.join(staging, CHECKPOINT_SUBDIR))
                    self.latest = name
                    self._report(metrics, checkpoint=ray.train.Checkpoint.from_directory(staging))
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
            else:
                # Other ranks only wrote their RNG state; it stays local.
                shutil.rmtree(src, ignore_errors=True)
                self.latest = name
                self._report(metrics)

    return RaydropReportCallback


def resolve_checkpoint_dir(path: str) -> str:
    """The directory holding trainer_state.json: Ray's checkpoint dir or its checkpoint/ child."""
    for cand in (os.path.join(path, CHECKPOINT_SUBDIR), path):
        if os.path.isfile(os.path.join(cand, TRAINER_STATE)):
            return cand
    raise FileNotFoundError(f"no {TRAINER_STATE} in {path} or {os.path.join(path, CHECKPOINT_SUBDIR)}")


def recorded_step(uri: str) -> Optional[int]:
    """The step Ray Train recorded for a checkpoint when it was reported: the
    last line of its trial's result.json that names it, the record the
    pipeline picked the checkpoint from. None when there is no such record (a
    folder that is not in a Ray Train trial)."""
    import result

    path = uri.rstrip("/")
    if posixpath.basename(path) == CHECKPOINT_SUBDIR:
        path = posixpath.dirname(path)
    name, trial = posixpath.basename(path), posixpath.dirname(path)
    try:
        fs, base = result.filesystem(trial if result.is_uri(trial) else os.path.abspath(trial))
        with fs.open_input_stream(posixpath.join(base, "result.json")) as f:
            text = f.read().decode("utf-8")
    except (OSError, ValueError):
        return None
    step = None
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if row.get("checkpoint_dir_name") == name and row.get("step") is not None:
            step = int(row["step"])
    return step


def resume_cache_dir(uri: str, root: str) -> str:
    """Where a checkpoint is copied on the node: named by its URI, so that the
    copy of one attempt's checkpoint is never taken for another's (the
    RayCluster, and its nodes' disks, outlive attempts)."""
    key = hashlib.sha256(uri.rstrip("/").encode("utf-8")).hexdigest()[:20]
    return os.path.join(root, "raydrop-resume", key)


def fetch_checkpoint(uri: str, root: str) -> str:
    """Copy a checkpoint (gs://, other pyarrow URI, or local path) under root
    (once per node and URI); return its HF dir."""
    if os.path.isdir(uri):
        return resolve_checkpoint_dir(uri)
    import ray.train

    dest = resume_cache_dir(uri, root)
    clean_resume_cache(root, keep=dest)
    marker = os.path.join(dest, ".complete")
    if not os.path.exists(marker):
        shutil.rmtree(dest, ignore_errors=True)  # an interrupted copy
        os.makedirs(dest)
        ray.train.Checkpoint(path=uri).to_directory(dest)
        with open(marker, "w", encoding="utf-8") as f:
            f.write(uri + "\n")
    return resolve_checkpoint_dir(dest)


def clean_resume_cache(root: str, keep: Optional[str] = None) -> None:
    """Remove the node's copies of checkpoints (all but keep): each is as large
    as a checkpoint (about 8.5 GB with the tutorial's trainable embeddings), and
    once an attempt has loaded its own, no later attempt resumes from a copy
    made for another URI."""
    cache = os.path.join(root, "raydrop-resume")
    try:
        entries = os.listdir(cache)
    except FileNotFoundError:
        return
    for entry in entries:
        path = os.path.join(cache, entry)
        if keep is None or os.path.abspath(path) != os.path.abspath(keep):
            shutil.rmtree(path, ignore_errors=True)


# The entry of the first report that tells how the worker started (the
# pipeline's checkpoints.TrainerStartup): started_at, when train_func began
# (Ray had set up the runtime env and started the worker); weights_s, the
# seconds getting the base model (the node's copy) and loading it; data_s,
# the processor, rows, length filter and held-out rows; first_step_at, when
# the first optimizer step ended; stage_s, the seconds the driver spent
# staging the model, or waiting for it, before the workers started (part of
# the time before started_at, not Ray's runtime env). Times are Unix seconds.
STARTUP_KEY = "raydrop_startup"


def model_source(args: argparse.Namespace, scratch: str, rank: int) -> Tuple[str, Optional[str]]:
    """What from_pretrained loads the processor and the model from, and at which revision:
    with --staged-model, the node's copy of the staged snapshot (weights.py; kept in
    scratch's models/, which no cleaning here removes); otherwise --model-id on the Hub at
    --model-revision (None: its default branch)."""
    if not getattr(args, "staged_model", ""):
        return args.model_id, getattr(args, "model_revision", "") or None
    start = time.monotonic()
    folder = weights.fetch_to_node(args.staged_model, scratch, lambda msg: log.info("%s", msg))
    log.info("model: rank %d loads %s (ready after %.1f s)", rank, folder, time.monotonic() - start)
    return folder, None


def check_dropped(rows: int, dropped: int, max_length: int, max_share: float, longest: int) -> None:
    """Refuse to train when more of the dataset than max_share is too long to train on."""
    if rows and dropped / rows > max_share:
        raise ValueError(
            f"{dropped} of {rows} rows ({100.0 * dropped / rows:.1f} %) are longer than --max-seq-length "
            f"{max_length} tokens (image block included; the longest has {longest}), more than "
            f"--max-dropped-share {max_share:g} allows: raise training.maxSeqLength or training.maxDroppedShare"
        )


def sft_config(args: argparse.Namespace, output_dir: str):
    from trl import SFTConfig

    return SFTConfig(**sft_config_kwargs(args, output_dir))


def sft_config_kwargs(args: argparse.Namespace, output_dir: str) -> Dict[str, Any]:
    """SFTConfig's arguments for the flags (transformers' TrainingArguments plus
    TRL's max_length, dataset_kwargs and completion settings)."""
    use_gpu = bool(args.use_gpu)
    return dict(
        output_dir=output_dir,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_batch_size,
        per_device_eval_batch_size=args.per_device_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        optim="adamw_torch_fused" if use_gpu else "adamw_torch",
        learning_rate=args.learning_rate,
        lr_scheduler_type=effective_lr_scheduler(args.lr_scheduler, args.warmup_ratio),
        warmup_ratio=args.warmup_ratio,
        max_grad_norm=args.max_grad_norm,
        logging_steps=args.logging_steps,
        # The NaN/inf filter reads every micro-batch's loss on the host.
        logging_nan_inf_filter=False,
        save_strategy=args.save_strategy,
        save_steps=args.save_steps,
        bf16=use_gpu,
        use_cpu=not use_gpu,
        seed=args.seed,
        data_seed=args.seed,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=args.max_seq_length,
        average_tokens_across_devices=True,
        # A PeftModel is not a PreTrainedModel, so transformers would otherwise
        # make DDP search the autograd graph for unused parameters every step.
        ddp_find_unused_parameters=False,
        dataloader_num_workers=args.dataloader_num_workers,
        dataloader_pin_memory=use_gpu,
        # accelerate copies each batch to the GPU with non_blocking=False unless
        # told otherwise: a wait for the device per micro-batch. From pinned
        # memory the copy is queued on the stream like a kernel, same results.
        accelerator_config={"non_blocking": use_gpu},
        dataloader_persistent_workers=args.dataloader_num_workers > 0,
    )


def train_func(config: Dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker: the rank trains with its heartbeat beating."""
    import ray.train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rank = ray.train.get_context().get_world_rank()
    beat = heartbeat.Heartbeat(config["storage_path"], config["experiment_name"], rank, log=log.warning).start()
    try:
        _train(config, rank, beat)
    finally:
        beat.stop()


def _train(config: Dict[str, Any], rank: int, beat: heartbeat.Heartbeat) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from transformers import AutoProcessor, set_seed

    started_at = time.time()
    args = argparse.Namespace(**config)
    set_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True

    scratch = os.environ.get(SCRATCH_ENV) or tempfile.gettempdir()
    output_dir = tempfile.mkdtemp(prefix=f"raydrop-{args.run_id}-rank{rank}-", dir=scratch)
    training_args = sft_config(args, output_dir)
    device = ray.train.torch.get_device() if args.use_gpu else None

    # One process per node downloads (dataset, model, checkpoint) into the
    # node's caches; the others then read those caches. The rows are checked
    # before the model is fetched from the Hub, so a dataset that cannot train
    # fails fast; a staged model's node copy comes first, as it holds the
    # processor the check needs.
    fmt = data.Format.from_json(json.loads(args.dataset_format) if getattr(args, "dataset_format", "") else None)
    revision = getattr(args, "dataset_revision", "")
    clock = time.monotonic()
    model_dir, model_rev = model_source(args, scratch, rank)
    weights_s = time.monotonic() - clock
    clock = time.monotonic()
    with training_args.main_process_first(local=True, desc="load processor and dataset"):
        processor = AutoProcessor.from_pretrained(model_dir, revision=model_rev, use_fast=True)
        dataset = data.load_rows(args.dataset_id, args.dataset_split, fmt, revision)

    rows = len(dataset)
    dataset, dropped, longest = data.filter_by_length(dataset, processor, args.max_seq_length, fmt)
    if rank == 0:
        log.info("dataset: %d rows, %d left out as longer than %d tokens (longest %d)",
                 rows, dropped, args.max_seq_length, longest)
    check_dropped(rows, dropped, args.max_seq_length, args.max_dropped_share, longest)
    eval_dataset = None
    if args.eval_split:
        with training_args.main_process_first(local=True, desc="load the evaluation split"):
            eval_dataset = data.load_rows(args.dataset_id, args.eval_split, fmt, revision)
        eval_dataset, _, _ = data.filter_by_length(eval_dataset, processor, args.max_seq_length, fmt)
    else:
        dataset, eval_dataset = data.hold_out(dataset, args.eval_share, args.seed)
    data_s = time.monotonic() - clock
    data_stats = {"dataset_rows": rows, "dropped_rows": dropped, "max_seq_length": args.max_seq_length,
                  "eval_rows": len(eval_dataset) if eval_dataset is not None else 0}
    if rank == 0:
        log.info("training on %d rows, evaluating every checkpoint on %d", len(dataset), data_stats["eval_rows"])

    resume_dir = None
    with training_args.main_process_first(local=True, desc="load model and checkpoint"):
        clock = time.monotonic()
        model = modeling.load_model(model_dir, args.quantization, args.attention, args.use_gpu, device,
                                    revision=model_rev)
        weights_s += time.monotonic() - clock
        if args.resume_from:
            resume_dir = fetch_checkpoint(args.resume_from, scratch)
    resume_step = None
    if resume_dir:
        # The step the pipeline expects: what Ray Train recorded for the
        # checkpoint it was told to resume from, not the copy's own
        # trainer_state.json (the Trainer restores exactly that one).
        resume_step = recorded_step(args.resume_from)
        if resume_step is None and rank == 0:
            log.warning("no Ray Train record of %s: the resumed step cannot be checked", args.resume_from)

    collator = data.Collator(processor, completion_only=args.completion_only_loss,
                             pad_to_multiple_of=8 if args.use_gpu else None, fmt=fmt)
    peft_config = modeling.lora_config(
        args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_target_modules,
        vision_tower=args.lora_vision_tower, train_embeddings=args.train_embeddings,
    )
    trainer = sft.trainer_class()(
        model=model,
        args=training_args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        data_collator=collator,
        peft_config=peft_config,
    )
    callback = _make_callback_class()(
        data_stats, resume_step, evaluate=trainer.evaluate if eval_dataset is not None else None,
        watch=notice.Watch(device=device, kv_key=getattr(args, "notice_key", None) if rank == 0 else None,
                           tell_key=getattr(args, "notice_key", None)),
        startup={"started_at": started_at, "weights_s": round(weights_s, 3), "data_s": round(data_s, 3),
                 "stage_s": round(getattr(args, "stage_s", 0.0), 3)},
        heartbeat=beat)
    trainer.add_callback(callback)
    if rank == 0:
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in trainer.model.parameters())
        log.info("trainable parameters: %d of %d", trainable, total)
    trainer.train(resume_from_checkpoint=resume_dir)
    shutil.rmtree(output_dir, ignore_errors=True)
    # Every rank on the node has loaded the resumed checkpoint by now; its copy
    # (and any earlier attempt's) only fills the node's disk.
    trainer.accelerator.wait_for_everyone()
    if training_args.local_process_index == 0:
        clean_resume_cache(scratch)
    if callback.preempted_at is not None:
        return  # the grace period is short: the checkpoint is saved, the rest waits for the next attempt
    if rank == 0 and args.sample_answers > 0 and eval_dataset is not None:
        beat.note("sampling")
        rows = eval_dataset.select(range(min(args.sample_answers, len(eval_dataset))))
        try:
            doc = samples.write(trainer.model, processor, rows, args.storage_path, args.experiment_name, fmt=fmt)
            log.info("wrote %d sample answers (tuned and base) in %.1f s", doc["count"], doc["seconds"])
        except Exception:  # noqa: BLE001 - the model is trained and saved; the run stands without them
            log.exception("could not write the sample answers; the completion mark will name none")
