"""The local cloud's Hub repositories (infra/localcloud/hub/repos) are what
tests/hub_repos.py writes from the tiny model, byte for byte."""

from __future__ import annotations

import filecmp
import os

import hub_repos


def _files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def test_committed_repos_are_what_the_generator_writes(tmp_path):
    fresh = hub_repos.write(str(tmp_path / "repos"))
    committed = os.path.abspath(hub_repos.DEFAULT_DEST)
    assert _files(fresh) == _files(committed), "run: python tests/hub_repos.py (from trainer/) and commit the result"
    stale = [f for f in _files(fresh) if not filecmp.cmp(os.path.join(fresh, f), os.path.join(committed, f), shallow=False)]
    assert not stale, f"{stale} differ: run python tests/hub_repos.py (from trainer/) and commit the result"


def test_dataset_has_the_tutorial_shape(tmp_path):
    import datasets

    root = hub_repos.write_dataset(str(tmp_path / "ds"))
    ds = datasets.load_dataset("parquet", data_files=os.path.join(root, "data", "*.parquet"), split="train")
    assert ds.column_names == hub_repos.COLUMNS
    assert len(ds) == hub_repos.DATASET_ROWS
    assert isinstance(ds.features["image"], datasets.Image)
    assert ds[0]["image"].size == hub_repos.SIZES[0]
