"""Command line of the raydrop trainer.

The Go side passes every flag as two argv tokens (``--flag value``) and
booleans as ``true``/``false``; the names here are a contract with it.
This module imports nothing heavy so that parsing is instant and testable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Dict, Optional, Sequence

RUN_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")

# defaults.json beside this file: the step's shape and the length filter,
# shared with the job spec (the Go side embeds the same file) and the GPU
# benchmark, so that what runs is what is measured.
DEFAULTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "defaults.json")


def load_defaults(path: str = DEFAULTS_FILE) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


DEFAULTS = load_defaults()

# The job spec's dataset section (JSON), set by the pipeline in the RayJob's
# runtime env: templates and system messages are free text, so they travel as
# data and never through the entrypoint's shell.
DATASET_FORMAT_ENV = "RAYDROP_DATASET_FORMAT"

# Flags whose value changes the trained model. Each default is the better
# choice; the reference tutorial's behaviour is the other value.
TUTORIAL_MODEL_CHOICES = {
    "quantization": "4bit",
    "attention": "eager",
    "lora_vision_tower": True,
    "train_embeddings": True,
    "completion_only_loss": False,
    "gradient_checkpointing": True,
}


def parse_bool(value: str) -> bool:
    """Parse the booleans the Go side writes (true/false), leniently."""
    v = str(value).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}")
    return n


def _non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return n


def _unit_float(value: str) -> float:
    f = float(value)
    if not 0.0 <= f < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value!r}")
    return f


def _share(value: str) -> float:
    f = float(value)
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {value!r}")
    return f


def _run_id(value: str) -> str:
    if not RUN_ID_RE.match(value):
        raise argparse.ArgumentTypeError(f"run id must match {RUN_ID_RE.pattern}, got {value!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train.py",
        description="raydrop: LoRA fine-tuning of Gemma 3 on image+text data with TRL under Ray Train.",
    )
    g = p.add_argument_group("run")
    g.add_argument("--run-id", type=_run_id, default="local", help="raydrop run id, [a-z0-9-]")
    g.add_argument("--storage-path", required=True, help="Ray RunConfig.storage_path (gs://... or a local path)")
    g.add_argument("--experiment-name", default="", help="Ray RunConfig.name (default raydrop-<run-id>)")
    g.add_argument("--resume-from", default="", help="checkpoint URI or path to continue from")
    g.add_argument("--mark-notice", default="",
                   help="where to announce the completion mark once written (gs://<bucket>/raydrop-marks/<run>/attempt-<n>.json)")

    g = p.add_argument_group("model and data")
    g.add_argument("--model-id", default="google/gemma-3-4b-it", help="HF repo id or local directory")
    g.add_argument("--staged-model", default="",
                   help="where the model's snapshot is (to be) staged, gs://<bucket>/models/<repo id>/<commit>: "
                        "the workers load it from a copy on their node instead of --model-id (weights.py); "
                        "empty: load --model-id")
    g.add_argument("--stage-model", type=parse_bool, default=False,
                   help="this run copies --model-id at --model-revision from the Hub into --staged-model "
                        "(false: it waits for the run that does)")
    g.add_argument("--model-revision", default="",
                   help="the Hub revision of --model-id: with --stage-model, the commit to stage (40 hex "
                        "digits, which the pipeline resolves); without --staged-model, the branch, tag or commit "
                        "the workers load; empty: the default branch")
    g.add_argument("--dataset-id", default="philschmid/amazon-product-descriptions-vlm",
                   help="HF repo id or local path (datasets.load_from_disk or load_dataset)")
    g.add_argument("--dataset-revision", default="",
                   help="Hub dataset revision (branch, tag or commit); empty: the default branch")
    g.add_argument("--dataset-format", default=os.environ.get(DATASET_FORMAT_ENV, ""),
                   help="the spec's dataset section as JSON (format, template, messages); empty: the tutorial's "
                        f"template. Default: ${DATASET_FORMAT_ENV}, which the pipeline sets, so free text never "
                        "reaches a command line")
    g.add_argument("--dataset-split", default="train")
    g.add_argument("--eval-split", default="",
                   help="split to evaluate every checkpoint on (empty: hold out --eval-share of --dataset-split)")
    g.add_argument("--eval-share", type=_share, default=0.05,
                   help="share of --dataset-split held out for evaluation, at least one row, drawn with --seed; 0: no evaluation")
    g.add_argument("--sample-answers", type=_non_negative_int, default=8,
                   help="held-out rows answered after training by the tuned and the base model (0: none)")
    g.add_argument("--quantization", choices=("none", "4bit"), default="none",
                   help="none: bf16 weights; 4bit: bitsandbytes NF4 with double quantisation (QLoRA)")
    g.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    g.add_argument("--max-seq-length", type=_positive_int, default=DEFAULTS["maxSeqLength"],
                   help="samples longer than this (image tokens included) are left out and counted")
    g.add_argument("--max-dropped-share", type=_share, default=DEFAULTS["maxDroppedShare"],
                   help="fail before training when a larger share of the rows is longer than --max-seq-length")
    g.add_argument("--dataloader-num-workers", type=_non_negative_int, default=4,
                   help="processes decoding images per training worker (0: in the training process)")

    g.add_argument("--check-processes", type=_non_negative_int, default=0,
                   help="datacheck.py: processes encoding rows and decoding images (0: one per CPU)")
    g.add_argument("--estimate-tokens-per-gpu-second", type=float, default=188.0,
                   help="datacheck.py: training throughput the time and cost estimate assumes "
                        "(the reference run's 188 tokens/s per B200)")
    g.add_argument("--gpu-hour-usd", type=float, default=0.0,
                   help="datacheck.py: price of one GPU-hour for the cost estimate")

    g = p.add_argument_group("LoRA")
    g.add_argument("--lora-r", type=_positive_int, default=16)
    g.add_argument("--lora-alpha", type=_positive_int, default=16)
    g.add_argument("--lora-dropout", type=_unit_float, default=0.05)
    g.add_argument("--lora-target-modules", default="all-linear",
                   help="'all-linear' or a comma-separated list of module names")
    g.add_argument("--lora-vision-tower", type=parse_bool, default=False,
                   help="also put adapters on the SigLIP vision tower")
    g.add_argument("--train-embeddings", type=parse_bool, default=False,
                   help="train full copies of embed_tokens and lm_head (PEFT modules_to_save)")
    g.add_argument("--completion-only-loss", type=parse_bool, default=True,
                   help="loss on the assistant's answer only (false: every token but pad and image tokens)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=float, default=3.0)
    g.add_argument("--max-steps", type=int, default=-1, help="optimizer steps; -1: run --epochs")
    g.add_argument("--per-device-batch-size", type=_positive_int, default=DEFAULTS["perDeviceBatchSize"])
    g.add_argument("--gradient-accumulation-steps", type=_positive_int,
                   default=DEFAULTS["gradientAccumulationSteps"])
    g.add_argument("--learning-rate", type=float, default=2e-4)
    g.add_argument("--lr-scheduler", default="constant",
                   help="a transformers scheduler name; constant with a warmup ratio means constant_with_warmup")
    g.add_argument("--warmup-ratio", type=_unit_float, default=0.03)
    g.add_argument("--max-grad-norm", type=float, default=0.3)
    g.add_argument("--gradient-checkpointing", type=parse_bool, default=DEFAULTS["gradientCheckpointing"])
    g.add_argument("--seed", type=int, default=42)

    g = p.add_argument_group("logging and checkpoints")
    g.add_argument("--logging-steps", type=_positive_int, default=10)
    # No "no": the last step is always saved, so every run leaves a model.
    g.add_argument("--save-strategy", choices=("epoch", "steps"), default="epoch")
    g.add_argument("--save-steps", type=_positive_int, default=100)

    g = p.add_argument_group("cluster")
    g.add_argument("--num-workers", type=_positive_int, default=16)
    g.add_argument("--use-gpu", type=parse_bool, default=True)
    g.add_argument("--accelerator-type", default="", help="Ray accelerator type, e.g. B200 (empty: any)")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.experiment_name:
        args.experiment_name = f"raydrop-{args.run_id}"
    if "/" in args.experiment_name or args.experiment_name in (".", ".."):
        parser.error(f"--experiment-name must be a single path segment, got {args.experiment_name!r}")
    if args.max_steps == 0 or args.max_steps < -1:
        parser.error("--max-steps must be -1 (unset) or >= 1")
    if args.eval_share > 0.5:
        parser.error(f"--eval-share must be at most 0.5, got {args.eval_share}")
    if args.quantization == "4bit" and not args.use_gpu:
        parser.error("--quantization 4bit needs --use-gpu true (bitsandbytes 4-bit kernels are CUDA only)")
    if args.model_revision and args.staged_model and not COMMIT_RE.match(args.model_revision):
        parser.error(f"--model-revision with --staged-model must be a commit id (40 lower-case hex digits), "
                     f"got {args.model_revision!r}")
    if args.stage_model and not (args.staged_model and args.model_revision):
        parser.error("--stage-model true needs --staged-model (where to stage) and --model-revision (the commit)")
    if args.dataset_format:
        try:
            doc = json.loads(args.dataset_format)
        except json.JSONDecodeError as exc:
            parser.error(f"--dataset-format is not JSON: {exc}")
        if not isinstance(doc, dict):
            parser.error("--dataset-format must be a JSON object")
    args.resume_from = args.resume_from or None
    return args


def effective_lr_scheduler(name: str, warmup_ratio: float) -> str:
    """transformers' "constant" schedule ignores warmup; honour a warmup request."""
    if name == "constant" and warmup_ratio > 0:
        return "constant_with_warmup"
    return name


def lora_target_modules(value: str):
    """'all-linear' stays a string (PEFT's keyword); anything else is a list of names."""
    value = value.strip()
    if value == "all-linear":
        return value
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise ValueError("--lora-target-modules is empty")
    return names
