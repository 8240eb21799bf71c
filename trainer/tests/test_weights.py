"""Model staging (weights.py): the Hub to the bucket once, the bucket to each node once.

The Hub is a fake one on 127.0.0.1 (fakehub.py) serving the tiny model; the bucket
is a local folder, named by a path or a file:// URI as the pipeline names gs:// ones.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import shutil
import threading
import time
from datetime import datetime

import pyarrow.fs
import pytest

import weights
from fakehub import COMMIT, REPO, FakeHub

STAMP = "%Y-%m-%dT%H:%M:%SZ"


@pytest.fixture
def hub(assets):
    """The fake Hub serving the tiny model (and the files a repository holds beside it),
    with huggingface_hub's offline switch, read at its import, turned off meanwhile."""
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    was = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    reset_sessions()
    try:
        with FakeHub.of_folder(assets["model"]) as fake:
            yield fake
    finally:
        constants.HF_HUB_OFFLINE = was
        reset_sessions()


def model_sizes(folder):
    return {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_model_files_are_what_from_pretrained_reads():
    listing = [
        ("config.json", "file", 10), ("model-00001-of-00002.safetensors", "file", 50),
        ("model-00002-of-00002.safetensors", "file", 40), ("model.safetensors.index.json", "file", 5),
        ("tokenizer.model", "file", 7), ("tokenizer.json", "file", 8), ("chat_template.jinja", "file", 1),
        ("merges.txt", "file", 2), ("pytorch_model.bin", "file", 90), ("consolidated.pth", "file", 90),
        ("model.gguf", "file", 90), ("README.md", "file", 3), (".gitattributes", "file", 1),
        ("modeling_custom.py", "file", 4), ("original", "directory", 0), ("original/params.json", "file", 1),
        ("raydrop-staged.json", "file", 1),
    ]
    assert weights.model_files(listing) == [
        ("chat_template.jinja", 1), ("config.json", 10), ("merges.txt", 2),
        ("model-00001-of-00002.safetensors", 50), ("model-00002-of-00002.safetensors", 40),
        ("model.safetensors.index.json", 5), ("tokenizer.json", 8), ("tokenizer.model", 7),
    ]
    # Without safetensors, PyTorch's .bin files are the weights.
    assert weights.model_files([("config.json", "file", 1), ("pytorch_model.bin", "file", 9)]) == [
        ("config.json", 1), ("pytorch_model.bin", 9)]


def test_stage_copies_every_model_file_and_writes_the_marker_last(hub, assets, tmp_path, monkeypatch):
    uri = str(tmp_path / "bucket" / "models" / REPO / COMMIT)
    there_at_marker = {}
    write_json = weights.result.put_json

    def spy(fs, path, doc):
        if path.endswith("/" + weights.MARKER):
            there_at_marker.update(model_sizes(uri))
        write_json(fs, path, doc)

    monkeypatch.setattr(weights.result, "put_json", spy)
    lines = []
    marker = weights.stage(REPO, COMMIT, uri, "run-1", lines.append, endpoint=hub.url)

    expected = model_sizes(assets["model"])
    assert there_at_marker == {**expected, weights.HEARTBEAT: there_at_marker[weights.HEARTBEAT]}
    assert sorted(os.listdir(uri)) == sorted([*expected, weights.MARKER, weights.HEARTBEAT])
    for name in expected:
        assert read(os.path.join(uri, name)) == read(os.path.join(assets["model"], name)), name
    # Each model file read once; README, .gitattributes, .bin and original/ never.
    assert hub.gets == collections.Counter({n: 1 for n in expected})

    with open(os.path.join(uri, weights.MARKER), encoding="utf-8") as f:
        doc = json.load(f)
    assert doc == marker
    assert (doc["repo"], doc["commit"], doc["stagedBy"]) == (REPO, COMMIT, "run-1")
    assert doc["files"] == [{"path": n, "size": s} for n, s in expected.items()]
    datetime.strptime(doc["stagedAt"], STAMP)
    assert isinstance(doc["seconds"], float) and doc["seconds"] >= 0
    with open(os.path.join(uri, weights.HEARTBEAT), encoding="utf-8") as f:
        beat = json.load(f)
    assert beat["run"] == "run-1" and set(beat) == {"run", "at", "files", "bytes"}
    datetime.strptime(beat["at"], STAMP)
    assert any(line.startswith("model: staged ") for line in lines), lines


def test_staging_again_copies_only_what_is_missing(hub, assets, tmp_path):
    uri = "file://" + str(tmp_path / "bucket" / "models" / REPO / COMMIT)
    folder = uri[len("file://"):]
    first = weights.stage(REPO, COMMIT, uri, "run-1", lambda _: None, endpoint=hub.url)
    reads = hub.gets.copy()

    # A redelivered job: the marker is there, nothing is read or written.
    lines = []
    assert weights.stage(REPO, COMMIT, uri, "run-2", lines.append, endpoint=hub.url) == first
    assert hub.gets == reads and "staged already" in lines[0], lines

    # A stager that died before its marker: the next one copies only what is not there whole.
    os.remove(os.path.join(folder, weights.MARKER))
    with open(os.path.join(folder, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    again = weights.stage(REPO, COMMIT, uri, "run-3", lambda _: None, endpoint=hub.url)
    assert hub.gets - reads == collections.Counter({"model.safetensors": 1})
    assert again["stagedBy"] == "run-3" and again["files"] == first["files"]
    assert read(os.path.join(folder, "model.safetensors")) == read(os.path.join(assets["model"], "model.safetensors"))


def test_stage_beats_and_logs_while_it_copies(hub, tmp_path, monkeypatch):
    uri = str(tmp_path / "bucket")
    monkeypatch.setattr(weights, "BEAT_S", 0.05)
    monkeypatch.setattr(weights, "LOG_S", 0.0)
    beats = []
    write_json, copy = weights.result.put_json, weights._hub_to_bucket

    def spy(fs, path, doc):
        if path.endswith("/" + weights.HEARTBEAT):
            beats.append(doc)
        write_json(fs, path, doc)

    def slow_copy(*args):
        time.sleep(0.2)
        copy(*args)

    monkeypatch.setattr(weights.result, "put_json", spy)
    monkeypatch.setattr(weights, "_hub_to_bucket", slow_copy)
    lines = []
    weights.stage(REPO, COMMIT, uri, "run-1", lines.append, endpoint=hub.url)
    assert len(beats) >= 4 and beats[0]["files"] == 0 and beats[0]["bytes"] == 0, beats
    assert [b["files"] for b in beats] == sorted(b["files"] for b in beats) and beats[-1]["files"] > 0, beats
    assert all(b["run"] == "run-1" for b in beats)
    progress = [line for line in lines if line.startswith(f"model: staging {uri}: ")]
    assert progress and "GiB" in progress[-1] and "MiB/s" in progress[-1], lines


def test_stage_refuses_a_revision_without_weights(hub, tmp_path):
    hub.files = {"config.json": b"{}", "README.md": b"card"}
    with pytest.raises(ValueError, match=f"{REPO}@{COMMIT} has no .safetensors or .bin weights"):
        weights.stage(REPO, COMMIT, str(tmp_path / "b"), "run-1", lambda _: None, endpoint=hub.url)
    assert not os.path.exists(tmp_path / "b" / weights.MARKER)


def _put(folder, name, doc):
    weights.result.put_json(pyarrow.fs.LocalFileSystem(), os.path.join(folder, name), doc)


def test_await_returns_once_the_marker_appears(tmp_path):
    """A stager that beats longer than `stale` and then writes its marker: the waiter
    waits it out and returns the marker."""
    folder = str(tmp_path / "staged")
    os.makedirs(folder)

    def stager():
        for i in range(10):
            _put(folder, weights.HEARTBEAT, {"run": "run-1", "at": "now", "files": i, "bytes": i})
            time.sleep(0.1)
        _put(folder, weights.MARKER, {"repo": REPO, "commit": COMMIT, "files": []})

    thread = threading.Thread(target=stager)
    start = time.monotonic()
    thread.start()
    try:
        marker = weights.await_staged(folder, lambda _: None, poll=0.02, stale=0.5)
    finally:
        thread.join()
    assert marker["commit"] == COMMIT
    assert time.monotonic() - start >= 0.9


def test_await_gives_up_when_the_heartbeat_stops(tmp_path):
    """A silent heartbeat (the stager died, or has not started): the waiter returns None,
    saying why, and its caller stages the model itself."""
    folder = str(tmp_path / "staged")
    os.makedirs(folder)
    _put(folder, weights.HEARTBEAT, {"run": "run-dead", "at": "2025-01-01T00:00:00Z", "files": 1, "bytes": 7})
    said = []
    assert weights.await_staged(folder, said.append, poll=0.02, stale=0.3) is None
    assert len(said) == 1 and f"{folder} is not staged: no {weights.MARKER}" in said[0], said
    assert '"run": "run-dead"' in said[0] and "this run stages it" in said[0]

    never = str(tmp_path / "never")
    said.clear()
    assert weights.await_staged("file://" + never, said.append, poll=0.02, stale=0.2) is None
    assert "last heartbeat: none" in said[0]


def staged_bucket(assets, tmp_path) -> str:
    """The tiny model laid out as the stager leaves it; its file:// URI."""
    folder = tmp_path / "bucket" / "models" / REPO / COMMIT
    shutil.copytree(assets["model"], folder)
    files = [{"path": n, "size": s} for n, s in model_sizes(assets["model"]).items()]
    _put(str(folder), weights.MARKER, {"repo": REPO, "commit": COMMIT, "files": files, "stagedBy": "run-0",
                                       "stagedAt": "2025-01-01T00:00:00Z", "seconds": 0.5})
    return "file://" + str(folder)


def fetches(root):
    with open(weights.node_dir(root, REPO, COMMIT) + weights.NODE_FETCHES_SUFFIX, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _fetch_in_child(uri, root, barrier, out):
    # Each file takes a while to copy, so that every process reaches the node's copy
    # while the first is still making it.
    copy = weights._bucket_to_local

    def slow_copy(*args):
        time.sleep(0.2)
        copy(*args)

    weights._bucket_to_local = slow_copy
    barrier.wait()
    out.put(weights.fetch_to_node(uri, root, lambda _: None))


def test_processes_of_one_node_share_one_copy(assets, tmp_path):
    uri, root = staged_bucket(assets, tmp_path), str(tmp_path / "scratch")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_fetch_in_child, args=(uri, root, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 4
    folders = [out.get(timeout=5) for _ in procs]

    dest = weights.node_dir(root, REPO, COMMIT)
    assert folders == [dest] * 4 and dest == os.path.join(root, "models", REPO, COMMIT)
    record = fetches(root)
    assert len(record) == 4 and len({r["pid"] for r in record}) == 4
    assert [r["copied"] for r in record] == [True, False, False, False], record
    copied = model_sizes(dest)
    assert copied.pop(weights.NODE_COMPLETE) > 0 and copied == model_sizes(assets["model"])


def test_a_copy_cut_short_is_redone(assets, tmp_path):
    uri, root = staged_bucket(assets, tmp_path), str(tmp_path / "scratch")
    dest = weights.node_dir(root, REPO, COMMIT)
    os.makedirs(dest)
    with open(os.path.join(dest, "model.safetensors"), "wb") as f:
        f.write(read(os.path.join(assets["model"], "model.safetensors"))[:1000])

    assert weights.fetch_to_node(uri, root, lambda _: None) == dest
    assert weights.fetch_to_node(uri, root, lambda _: None) == dest
    # A complete copy whose file changed since is not used either.
    with open(os.path.join(dest, "config.json"), "a", encoding="utf-8") as f:
        f.write(" ")
    lines = []
    weights.fetch_to_node(uri, root, lines.append)
    assert [r["copied"] for r in fetches(root)] == [True, False, True]
    n = len(model_sizes(assets["model"]))
    assert any(line.startswith(f"model: copied {n}/{n} files") for line in lines), lines
    for name in model_sizes(assets["model"]):
        assert read(os.path.join(dest, name)) == read(os.path.join(assets["model"], name)), name


def test_the_node_copy_loads_and_outlives_the_resume_cache_cleaning(assets, tmp_path):
    from transformers import AutoProcessor

    import modeling
    import worker

    uri, root = staged_bucket(assets, tmp_path), str(tmp_path / "scratch")
    folder = weights.fetch_to_node(uri, root, lambda _: None)
    worker.clean_resume_cache(root)
    os.makedirs(os.path.join(root, "raydrop-resume", "old"))
    worker.clean_resume_cache(root)
    assert weights.fetch_to_node(uri, root, lambda _: None) == folder
    assert [r["copied"] for r in fetches(root)] == [True, False]

    model = modeling.load_model(folder, "none", "sdpa", use_gpu=False)
    processor = AutoProcessor.from_pretrained(folder, use_fast=True)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert type(processor).__name__ == "Gemma3Processor" and processor.chat_template


def test_fetch_without_a_marker_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no model staged at {tmp_path}: {weights.MARKER} is missing"):
        weights.fetch_to_node(str(tmp_path), str(tmp_path / "scratch"), lambda _: None)
