"""The data check (datacheck.py): its figures on good data, and each class of
bad data or model refused with the file, row and column in the message."""

from __future__ import annotations

import json
import os

import pytest

import data
import datacheck
import tiny

TEMPLATE = {"format": "template", "template": {"system": "You answer in one word.", "prompt": "{question}",
                                               "answer": "colour", "images": ["image"]}}


def check(tmp_path, assets, dataset, fmt=TEMPLATE, extra=()):
    storage = str(tmp_path / "run")
    argv = ["--storage-path", storage, "--model-id", assets["model"], "--dataset-id", dataset,
            "--dataset-format", json.dumps(fmt), "--num-workers", "2", "--per-device-batch-size", "2",
            "--gradient-accumulation-steps", "1", "--epochs", "3", "--max-seq-length", "200",
            "--eval-share", "0.25", "--check-processes", "2", "--gpu-hour-usd", "10"] + list(extra)
    code = datacheck.main(argv)
    with open(os.path.join(storage, datacheck.CHECK_FILE), encoding="utf-8") as f:
        return code, json.load(f)


def test_good_data_gets_its_figures(tmp_path, assets, processor):
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=24)
    code, doc = check(tmp_path, assets, folder)
    assert code == 0 and doc["ok"], doc
    assert doc["rows"] == {"total": 24, "kept": 24, "train": 18, "eval": 6, "leftOut": 0}
    assert doc["images"]["total"] == 24 and doc["images"]["perRow"] == {"1": 24}
    assert doc["images"]["width"] == {"min": 40, "p50": 40, "max": 40}
    # The lengths are the trainer's own encoding of each row.
    fmt = data.Format.from_json(TEMPLATE)
    ds = data.load_rows(folder, "train", fmt)
    lengths = sorted(len(data.encode(processor, ds[i], fmt)[0]) for i in range(len(ds)))
    assert doc["tokens"]["max"] == lengths[-1] and doc["tokens"]["p50"] == lengths[11]
    assert doc["tokens"]["answer"] == sum(sum(data.encode(processor, ds[i], fmt)[1]) for i in range(len(ds)))
    # 18 rows on 2 workers at batch 2: 5 batches a rank, 5 steps an epoch, 15 in 3 epochs.
    assert doc["steps"] == {"perEpoch": 5, "total": 15}
    est = doc["estimate"]
    assert est["tokensPerGpuSecond"] == 188.0 and est["gpus"] == 2
    assert est["seconds"] == pytest.approx(doc["tokens"]["train"] * 3 / (188.0 * 2), abs=0.1)
    assert est["usd"] == pytest.approx(est["gpuHours"] * 10, abs=0.01)
    assert doc["processes"] == 2


def test_rows_too_long_are_counted_then_refused(tmp_path, assets):
    long = lambda i: {"question": "What colour? " + ("very " * 60 if i % 4 == 0 else "")}  # noqa: E731
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=16, extra=long)
    code, doc = check(tmp_path, assets, folder, extra=["--max-dropped-share", "0.5"])
    assert code == 0 and doc["leftOut"] == {"tooLong": 4} and doc["leftOutRows"]["tooLong"] == [0, 4, 8, 12]
    assert doc["rows"]["kept"] == 12
    code, doc = check(tmp_path, assets, folder, extra=["--max-dropped-share", "0.1"])
    assert code == datacheck.EXIT_INVALID_DATA and doc["reason"] == "InvalidData"
    assert "4 of 16 rows (25.0 %) are left out (4 longer than training.maxSeqLength)" in doc["message"]


def test_an_image_that_does_not_decode(tmp_path, assets):
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=8)
    with open(os.path.join(folder, "images", "05.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n but not really")
    code, doc = check(tmp_path, assets, folder)
    assert code == datacheck.EXIT_INVALID_DATA and not doc["ok"]
    assert "metadata.jsonl line 6 column 'image': image " in doc["message"]
    assert "images/05.png does not decode" in doc["message"]


def test_a_missing_column_and_a_placeholder_with_no_column(tmp_path, assets):
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=4)
    fmt = {"format": "template", "template": {"prompt": "{question} {shape}", "answer": "label", "images": ["image"]}}
    code, doc = check(tmp_path, assets, folder, fmt=fmt)
    assert code == datacheck.EXIT_INVALID_DATA
    assert "lacks column(s) ['shape', 'label']" in doc["message"]
    assert "dataset.template.prompt has placeholder(s) ['{shape}']" in doc["message"]
    assert "metadata.jsonl" in doc["message"]


def test_an_empty_split(tmp_path, assets):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "metadata.jsonl").write_text("")
    code, doc = check(tmp_path, assets, str(folder))
    assert code == datacheck.EXIT_INVALID_DATA and "has no rows" in doc["message"]


def test_messages_with_a_wrong_image_count(tmp_path, assets):
    folder = tiny.write_messages_jsonl(str(tmp_path / "d"), n=6)
    path = os.path.join(folder, "train.jsonl")
    lines = open(path, encoding="utf-8").read().splitlines()
    row = json.loads(lines[2])
    row["images"] = row["images"][:1]  # two placeholders, one image
    lines[2] = json.dumps(row)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    code, doc = check(tmp_path, assets, folder, fmt={"format": "messages"})
    assert code == datacheck.EXIT_INVALID_DATA
    assert "train.jsonl line 3: 2 image placeholder(s) in the conversation for 1 image(s)" in doc["message"]


def test_messages_good(tmp_path, assets):
    folder = tiny.write_messages_jsonl(str(tmp_path / "d"), n=9)
    code, doc = check(tmp_path, assets, folder, fmt={"format": "messages"})
    assert code == 0, doc
    assert doc["images"]["perRow"] == {"0": 3, "1": 3, "2": 3} and doc["images"]["total"] == 9


def test_a_model_that_is_not_gemma3(tmp_path, assets):
    from transformers import LlamaConfig

    model = str(tmp_path / "llama")
    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, architectures=["LlamaForCausalLM"]).save_pretrained(model)
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=4)
    code, doc = check(tmp_path, {**assets, "model": model}, folder)
    assert code == datacheck.EXIT_INVALID_MODEL and doc["reason"] == "InvalidModel"
    assert "is LlamaForCausalLM (model_type 'llama'); accepted: Gemma3ForConditionalGeneration" in doc["message"]


def test_the_tutorial_dataset(tmp_path, assets):
    """The toy copy of the tutorial's columns, in the default format: its long row is left out."""
    code, doc = check(tmp_path, assets, assets["dataset"], fmt={},
                      extra=["--max-dropped-share", "0.1", "--max-seq-length", "512"])
    assert code == 0, doc
    assert doc["rows"]["total"] == 17 and doc["leftOut"] == {"tooLong": 1}


def test_rows_without_an_answer_are_left_out(tmp_path, assets, processor):
    """A blank or missing answer leaves the row out (training leaves it out too)."""
    blank = lambda i: {"colour": "  "} if i == 2 else ({"colour": None} if i == 5 else {})  # noqa: E731
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=12, extra=blank)
    code, doc = check(tmp_path, assets, folder, extra=["--max-dropped-share", "0.2"])
    assert code == 0 and doc["leftOut"] == {"noAnswer": 2} and doc["leftOutRows"]["noAnswer"] == [2, 5], doc
    fmt = data.Format.from_json(TEMPLATE)
    kept, dropped, _ = data.filter_by_length(data.load_rows(folder, "train", fmt), processor, 200, fmt)
    assert dropped == 2 and len(kept) == doc["rows"]["kept"] == 10


def test_a_hub_revision_is_resolved_to_the_commit_read(monkeypatch):
    import huggingface_hub

    class Info:
        sha = "0123456789abcdef0123456789abcdef01234567"

    asked = []
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info",
                        lambda self, repo, revision=None: asked.append((repo, revision)) or Info())
    monkeypatch.setattr(huggingface_hub.HfApi, "auth_check", lambda self, repo, repo_type=None: None)
    assert datacheck.resolve_revision("my-org/receipts", "main") == Info.sha
    assert datacheck.resolve_revision("my-org/receipts", "") == Info.sha
    assert asked == [("my-org/receipts", "main"), ("my-org/receipts", None)]
    # A folder is not on the Hub; an unreachable Hub leaves the revision as given.
    assert datacheck.resolve_revision("/no/such/folder-but-absolute", "v1") in ("v1",)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda self, repo, revision=None: 1 / 0)
    assert datacheck.resolve_revision("my-org/receipts", "v2") == "v2"


def test_what_the_hub_refuses_is_the_datas_fault(monkeypatch):
    """A revision or dataset the Hub does not have, or a gated one the token may not read,
    is InvalidData with what to change: datasets would otherwise fall back to a copy it
    cached under the same name, whatever the revision. (The local cloud's end-to-end suite
    checks the same against its Hub.)"""
    import huggingface_hub
    import requests
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    def answer(status):
        r = requests.Response()
        r.status_code = status
        return r

    monkeypatch.setattr(huggingface_hub.HfApi, "auth_check", lambda self, repo, repo_type=None: None)
    for exc, said in (
        (RevisionNotFoundError("Invalid rev id: v9", response=answer(404)), "has no revision 'v9' on the Hub"),
        (RepositoryNotFoundError("nope", response=answer(404)), "does not exist on the Hub, or it is private"),
        (GatedRepoError("gated", response=answer(401)), "is gated on the Hub and the deployment's Hub token is not set"),
        (GatedRepoError("gated", response=answer(403)), "has not been granted access"),
    ):
        def refuse(self, repo, revision=None, exc=exc):
            raise exc
        monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", refuse)
        with pytest.raises(data.DataError, match=said):
            datacheck.resolve_revision("my-org/receipts", "v9")


def test_the_check_stages_the_model_first(tmp_path, assets, processor, monkeypatch):
    """With --staged-model, the check's driver stages the model (on the head, before any GPU
    worker exists) once the model is known to be one the trainer can fine-tune, then checks
    the data. The Hub is a fake one serving the tiny model; the model check itself is
    covered by test_a_model_that_is_not_gemma3 and is given the tiny model's processor."""
    import collections

    import huggingface_hub.constants

    import fakehub
    import weights

    checked = []
    monkeypatch.setattr(datacheck, "check_model", lambda model_id, revision=None: checked.append(model_id) or processor)
    # The suite is offline (conftest.py); this test reaches the fake Hub on 127.0.0.1 only.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    folder = tiny.write_imagefolder(str(tmp_path / "d"), n=8)
    uri = "file://" + str(tmp_path / "bucket" / "models" / fakehub.REPO / fakehub.COMMIT)
    with fakehub.FakeHub.of_folder(assets["model"]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        code, doc = check(tmp_path, {**assets, "model": fakehub.REPO}, folder, extra=[
            "--run-id", "run-1", "--staged-model", uri, "--stage-model", "true", "--model-revision", fakehub.COMMIT])
    assert code == 0 and doc["ok"], doc
    assert checked == [fakehub.REPO]
    assert hub.gets == collections.Counter({n: 1 for n in os.listdir(assets["model"])})
    with open(os.path.join(uri[len("file://"):], weights.MARKER), encoding="utf-8") as f:
        marker = json.load(f)
    assert marker["stagedBy"] == "run-1" and marker["commit"] == fakehub.COMMIT
