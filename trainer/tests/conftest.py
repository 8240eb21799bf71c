"""Shared fixtures: offline environment, the tiny model and dataset, a local Ray cluster."""

from __future__ import annotations

import os
import sys

import pytest

TRAINER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The completion mark's schema, the one contract the trainer, the pipeline's reader
# (pkg/checkpoints) and the local cloud's simulated trainer all check their marks against.
MARK_SCHEMA = os.path.join(os.path.dirname(TRAINER_DIR), "schemas", "mark.v1.json")


def check_mark(doc: dict) -> dict:
    """Fail unless doc is a completion mark as schemas/mark.v1.json defines it; returns doc."""
    import json

    import jsonschema

    with open(MARK_SCHEMA, encoding="utf-8") as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    problems = [f"{'/'.join(map(str, e.absolute_path)) or '(mark)'}: {e.message}" for e in validator.iter_errors(doc)]
    assert not problems, problems
    return doc
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Nothing may reach the network; set before transformers/datasets are imported.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_V2_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}
os.environ.update(OFFLINE_ENV)
os.environ.pop("HF_TOKEN", None)

for p in (TRAINER_DIR, TESTS_DIR):
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    """Paths of the saved tiny model (with processor) and the toy dataset."""
    import tiny

    root = tmp_path_factory.mktemp("assets")
    model = tiny.save_model(str(root / "model"))
    dataset = tiny.save_dataset(str(root / "dataset"))
    return {"model": model, "dataset": dataset}


@pytest.fixture(scope="session")
def processor(assets):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(assets["model"], use_fast=True)


GEMMA3_TOKENIZER_ENV = "RAYDROP_GEMMA3_TOKENIZER"


def gemma3_tokenizer_dir() -> str:
    """Where Gemma 3's real tokenizer is (tokenizer.json and tokenizer_config.json); empty when not set."""
    d = os.environ.get(GEMMA3_TOKENIZER_ENV, "")
    return d if os.path.isfile(os.path.join(d, "tokenizer.json")) else ""


@pytest.fixture(scope="session")
def gemma3_processor():
    """A Gemma3Processor with Gemma 3's real tokenizer and chat template and
    google/gemma-3-4b-it's image settings; skips without RAYDROP_GEMMA3_TOKENIZER."""
    import tiny

    tok_dir = gemma3_tokenizer_dir()
    if not tok_dir:
        pytest.skip(f"{GEMMA3_TOKENIZER_ENV} is not set (make trainer-test sets it)")
    return tiny.gemma3_processor(tok_dir)


@pytest.fixture(scope="session")
def dataset(assets):
    import data

    return data.load_rows(assets["dataset"], "train")


_session = {}


@pytest.fixture(scope="session")
def ray_logs(ray_address):
    """The shared local Ray cluster's log folder (<session dir>/logs), as a Ray node's
    /tmp/ray/session_latest/logs."""
    return os.path.join(_session["dir"], "logs")


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory):
    """A local Ray cluster, shared by the tests that run Ray Train for real.

    Its workers inherit this process's environment, which deliberately does not
    put the trainer directory on PYTHONPATH: as on the cluster, the workers get
    the trainer's code from the driver.
    """
    import shutil
    import tempfile

    import ray

    temp_dir = tempfile.mkdtemp(prefix="rd-ray-", dir="/tmp")  # Unix socket paths must stay short
    # The workers' node-local copies (resumed checkpoints) go where the pods'
    # local SSD would be: here, a folder removed with the cluster.
    os.environ["RAYDROP_SCRATCH"] = tempfile.mkdtemp(prefix="scratch-", dir=temp_dir)
    # Where the workers look for a worker pod's notice file: this cluster's
    # own, not the machine-wide default another test run could touch.
    os.environ["RAYDROP_NOTICE_FILE"] = os.path.join(tempfile.mkdtemp(prefix="notice-", dir=temp_dir), "notice")
    ctx = ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
        _temp_dir=temp_dir,
    )
    _session["dir"] = ctx.address_info["session_dir"]
    yield ctx.address_info["address"]
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
