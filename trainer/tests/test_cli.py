"""The flag contract with the Go side."""

from __future__ import annotations

import json
import os
import shlex

import pytest

import cli
from conftest import TRAINER_DIR

REPO = os.path.dirname(TRAINER_DIR)
# The RayJob the Go side renders for the example spec (every default), kept
# current by the Go test that compares it with what the code renders.
GOLDEN_RAYJOB = os.path.join(REPO, "pkg", "manifests", "testdata", "example.golden.yaml")
# Flags whose value is the deployment's or the run's, not a training default.
PER_RUN = {"run_id", "storage_path", "experiment_name", "mark_notice", "accelerator_type",
           "staged_model", "stage_model", "model_revision"}

CONTRACT_ARGV = [
    "--run-id", "r-1", "--storage-path", "gs://b/raydrop/checkpoints", "--experiment-name", "exp",
    "--model-id", "google/gemma-3-4b-it", "--dataset-id", "philschmid/amazon-product-descriptions-vlm",
    "--dataset-split", "train", "--num-workers", "16", "--use-gpu", "true", "--accelerator-type", "B200",
    "--quantization", "none", "--attention", "sdpa", "--lora-r", "16", "--lora-alpha", "16",
    "--lora-dropout", "0.05", "--lora-target-modules", "all-linear", "--lora-vision-tower", "false",
    "--train-embeddings", "false", "--completion-only-loss", "true", "--epochs", "3",
    "--per-device-batch-size", "1", "--gradient-accumulation-steps", "4", "--learning-rate", "0.0002",
    "--lr-scheduler", "constant", "--warmup-ratio", "0.03", "--max-grad-norm", "0.3",
    "--max-seq-length", "512", "--max-dropped-share", "0.05", "--logging-steps", "10", "--save-strategy", "epoch", "--save-steps", "100",
    "--gradient-checkpointing", "true", "--seed", "42", "--max-steps", "-1", "--resume-from", "gs://b/x",
]


def test_contract_argv_parses():
    a = cli.parse_args(CONTRACT_ARGV)
    assert a.run_id == "r-1" and a.storage_path == "gs://b/raydrop/checkpoints" and a.experiment_name == "exp"
    assert a.num_workers == 16 and a.use_gpu is True and a.accelerator_type == "B200"
    assert a.lora_vision_tower is False and a.train_embeddings is False and a.completion_only_loss is True
    assert a.gradient_checkpointing is True and a.max_steps == -1 and a.resume_from == "gs://b/x"
    assert a.learning_rate == pytest.approx(2e-4) and a.epochs == 3 and a.max_seq_length == 512


def test_defaults_are_the_better_choices():
    a = cli.parse_args(["--storage-path", "/tmp/s"])
    assert (a.quantization, a.attention) == ("none", "sdpa")
    assert a.lora_vision_tower is False and a.train_embeddings is False and a.completion_only_loss is True
    assert a.gradient_checkpointing is False
    assert a.experiment_name == "raydrop-local" and a.resume_from is None and a.accelerator_type == ""
    for key, tutorial in cli.TUTORIAL_MODEL_CHOICES.items():
        assert getattr(a, key) != tutorial, key


def test_tutorial_choices_reachable():
    a = cli.parse_args(["--storage-path", "/s", "--quantization", "4bit", "--attention", "eager",
                        "--lora-vision-tower", "true", "--train-embeddings", "true",
                        "--completion-only-loss", "false", "--gradient-checkpointing", "true"])
    for key, tutorial in cli.TUTORIAL_MODEL_CHOICES.items():
        assert getattr(a, key) == tutorial, key


def test_staged_model_flags():
    commit = "0123456789abcdef0123456789abcdef01234567"
    uri = f"gs://b/models/google/gemma-3-4b-it/{commit}"
    a = cli.parse_args(["--storage-path", "/s", "--staged-model", uri, "--model-revision", commit,
                        "--stage-model", "true"])
    assert (a.staged_model, a.model_revision, a.stage_model) == (uri, commit, True)
    a = cli.parse_args(["--storage-path", "/s", "--staged-model", uri, "--model-revision", commit,
                        "--stage-model", "false"])
    assert a.stage_model is False
    a = cli.parse_args(["--storage-path", "/s"])
    assert (a.staged_model, a.model_revision, a.stage_model) == ("", "", False)
    # Not staged: the revision the workers load from the Hub, a branch or tag too.
    assert cli.parse_args(["--storage-path", "/s", "--model-revision", "v2.1"]).model_revision == "v2.1"


@pytest.mark.parametrize("argv", [
    ["--use-gpu", "maybe"],
    ["--run-id", "Bad_ID"],
    ["--quantization", "8bit"],
    ["--save-strategy", "best"],
    ["--save-strategy", "no"],  # a run always leaves a model
    ["--max-dropped-share", "1.5"],
    ["--max-steps", "0"],
    ["--experiment-name", "a/b"],
    ["--quantization", "4bit", "--use-gpu", "false"],
    ["--warmup-ratio", "1.5"],
    ["--staged-model", "gs://b/m", "--model-revision", "main"],  # staged: the commit resolved, never a branch
    ["--stage-model", "true", "--model-revision", "0123456789abcdef0123456789abcdef01234567"],
    ["--stage-model", "true", "--staged-model", "gs://b/models/m/c"],
])
def test_rejects(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--storage-path", "/s"] + argv)
    assert e.value.code == 2


def test_warmup_with_constant_schedule():
    assert cli.effective_lr_scheduler("constant", 0.03) == "constant_with_warmup"
    assert cli.effective_lr_scheduler("constant", 0.0) == "constant"
    assert cli.effective_lr_scheduler("cosine", 0.03) == "cosine"


def test_lora_targets():
    assert cli.lora_target_modules("all-linear") == "all-linear"
    assert cli.lora_target_modules("q_proj, v_proj") == ["q_proj", "v_proj"]
    with pytest.raises(ValueError):
        cli.lora_target_modules(" , ")


def _golden_entrypoint_args():
    import yaml

    with open(GOLDEN_RAYJOB, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "RayJob"]
    argv = shlex.split(docs[0]["spec"]["entrypoint"])
    assert argv[:2] == ["python", "/code/train.py"], argv[:2]
    return cli.parse_args(argv[2:])


def test_spec_defaults_are_the_trainer_defaults():
    """What a default spec runs is what the trainer runs with no flags: every
    flag the Go side passes for the example spec equals the trainer's own
    default (and so the benchmark's, which takes the trainer's)."""
    passed = vars(_golden_entrypoint_args())
    own = vars(cli.parse_args(["--storage-path", "/s"]))
    drift = {k: (passed[k], own[k]) for k in own if k not in PER_RUN and passed[k] != own[k]}
    assert not drift, f"spec default vs trainer default: {drift}"


def test_one_fast_default_from_defaults_json():
    with open(os.path.join(TRAINER_DIR, "defaults.json"), encoding="utf-8") as f:
        d = json.load(f)
    a = cli.parse_args(["--storage-path", "/s"])
    assert (a.per_device_batch_size, a.gradient_accumulation_steps, a.gradient_checkpointing) == (4, 1, False)
    assert (a.per_device_batch_size, a.gradient_accumulation_steps, a.gradient_checkpointing) == (
        d["perDeviceBatchSize"], d["gradientAccumulationSteps"], d["gradientCheckpointing"])
    assert (a.max_seq_length, a.max_dropped_share) == (d["maxSeqLength"], d["maxDroppedShare"])
    # The tutorial's global batch: 16 workers x 4 x 1 = 16 x 1 x 4.
    assert a.num_workers * a.per_device_batch_size * a.gradient_accumulation_steps == 64


def test_the_driver_keeps_the_builtin_print():
    """Once a worker's progress bar reached the driver, Ray's tqdm support would
    put its own print in builtins, and pickling a function that prints would
    then fail; train.py turns that off before Ray is imported."""
    import subprocess
    import sys

    code = (
        "import builtins, train; p = builtins.print\n"
        "from ray.experimental import tqdm_ray; tqdm_ray.instance()\n"
        "assert builtins.print is p, builtins.print\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_TQDM_PATCH_PRINT"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=TRAINER_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
