"""The GPU benchmark's code path and FLOPs arithmetic, on CPU with a tiny model."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import TRAINER_DIR

sys.path.insert(0, os.path.join(TRAINER_DIR, "bench"))

import flops  # noqa: E402


def test_flops_match_the_published_arithmetic():
    g = dict(d=2560, f=10240, L=34, h=8, kv=4, hd=256, V=262208, dv=1152, fv=4304, Lv=27, P=4096, mm=256)
    tut, _ = flops.flops_per_sample(g, 412.2, vision_lora=True, train_lm_head=True, grad_ckpt=True)
    assert tut["text_params"] + tut["lm_head_params"] == 3_879_895_040
    assert tut["vision_params"] == 411_070_464
    assert tut["lora_params"] == 29_802_496 + 8_695_296
    assert tut["model_flops"] == pytest.approx(2.009e13, rel=0.02)
    ours, _ = flops.flops_per_sample(g, 412.2)
    assert ours["backward"] < tut["backward"] / 2 and ours["recompute"] == 0


def test_bench_dry_run(tmp_path, capsys):
    import bench

    assert bench.main(["--dry-run", "--model-dir", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "raydrop / tutorial tokens/s" in out and "MFU =" in out and "Gemma 3 4B arithmetic" in out
