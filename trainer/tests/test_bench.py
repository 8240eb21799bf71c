"""The GPU benchmark's setups, code path and FLOPs arithmetic, on CPU with a tiny model."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from conftest import TRAINER_DIR

sys.path.insert(0, os.path.join(TRAINER_DIR, "bench"))

import flops  # noqa: E402

SHAPE_NUMBERS = ("tokens_per_second_per_gpu", "samples_per_second", "step_time_mean_s", "step_time_p50_s",
                 "mfu", "hfu", "model_flops", "hardware_flops", "seconds")


def test_flops_match_the_published_arithmetic():
    g = dict(d=2560, f=10240, L=34, h=8, kv=4, hd=256, V=262208, dv=1152, fv=4304, Lv=27, P=4096, mm=256)
    tut, _ = flops.flops_per_sample(g, 412.2, vision_lora=True, train_lm_head=True, grad_ckpt=True)
    assert tut["text_params"] + tut["lm_head_params"] == 3_879_895_040
    assert tut["vision_params"] == 411_070_464
    assert tut["lora_params"] == 29_802_496 + 8_695_296
    assert tut["model_flops"] == pytest.approx(2.009e13, rel=0.02)
    ours, _ = flops.flops_per_sample(g, 412.2)
    assert ours["backward"] < tut["backward"] / 2 and ours["recompute"] == 0


def test_raydrop_setup_is_the_trainer_default(monkeypatch):
    import bench
    import cli

    parser = cli.build_parser()
    setup = bench.raydrop_setup()
    for key in cli.TUTORIAL_MODEL_CHOICES:
        if key != "gradient_checkpointing":
            assert setup[key] == parser.get_default(key), key
    for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
        assert setup[key] == parser.get_default(key), key
    assert setup["per_device_batch_size"] == cli.DEFAULTS["perDeviceBatchSize"] == parser.get_default(
        "per_device_batch_size")
    assert setup["gradient_accumulation_steps"] == cli.DEFAULTS["gradientAccumulationSteps"] == parser.get_default(
        "gradient_accumulation_steps")
    assert setup["gradient_checkpointing"] is cli.DEFAULTS["gradientCheckpointing"] is parser.get_default(
        "gradient_checkpointing")

    # The setup follows the defaults file, whatever its values: nothing in the benchmark is hard-coded.
    monkeypatch.setitem(cli.DEFAULTS, "perDeviceBatchSize", 7)
    monkeypatch.setitem(cli.DEFAULTS, "gradientAccumulationSteps", 3)
    monkeypatch.setitem(cli.DEFAULTS, "gradientCheckpointing", not cli.DEFAULTS["gradientCheckpointing"])
    moved = bench.raydrop_setup()
    assert (moved["per_device_batch_size"], moved["gradient_accumulation_steps"]) == (7, 3)
    assert moved["gradient_checkpointing"] is cli.DEFAULTS["gradientCheckpointing"]

    tut = bench.tutorial_setup()
    assert {k: tut[k] for k in cli.TUTORIAL_MODEL_CHOICES} == cli.TUTORIAL_MODEL_CHOICES
    assert (tut["per_device_batch_size"], tut["gradient_accumulation_steps"]) == (1, 4)
    assert (tut["loss"], setup["loss"]) == ("stock", "raydrop")


def test_ablations_change_one_thing_each():
    import bench

    tut, ray = bench.tutorial_setup(), bench.raydrop_setup()
    rows = bench.ablation_setups()
    assert [r["name"] for r in rows] == [
        "tutorial+bf16", "tutorial+sdpa", "tutorial+text-lora", "tutorial+frozen-head", "tutorial+no-ckpt",
        "tutorial+answer-only", "tutorial+batch", "tutorial+raydrop-loss"]
    for r in rows:
        changed = {k for k in tut if k != "name" and r[k] != tut[k]}
        assert changed and all(r[k] == ray[k] for k in changed), r["name"]
        assert len(changed) == (2 if r["name"] == "tutorial+batch" else 1), (r["name"], changed)


def test_peak_by_exact_gpu_name():
    import bench

    assert bench.peak_flops("NVIDIA H200", 0, False)[0] == pytest.approx(989.4e12)
    assert bench.peak_flops("NVIDIA H200 NVL", 0, False)[0] == pytest.approx(835e12)
    assert bench.peak_flops("NVIDIA B200", 0, False)[0] == pytest.approx(2250e12)
    assert bench.peak_flops("NVIDIA GB200", 0, False)[0] == pytest.approx(2500e12)
    assert bench.peak_flops("NVIDIA H100 80GB HBM3", 0, False)[0] == pytest.approx(989.4e12)
    peak, note = bench.peak_flops("NVIDIA Future GPU", 0, False)
    assert peak is None and "--peak-tflops" in note
    assert bench.peak_flops("NVIDIA Future GPU", 1234, False)[0] == pytest.approx(1234e12)


def _check_ok_setup(report, name):
    r = report["setups"][name]
    assert r["status"] == "ok" and r["error"] is None, r.get("traceback")
    assert isinstance(r["trainer_class"], str) and r["trainable_parameters"] > 0
    for shape, s in r["shapes"].items():
        assert s["timed_steps"] == s["timed_steps_planned"] == r["steps"]["timed_per_shape"]
        assert 0 < s["tokens"] <= s["positions"]
        assert isinstance(s["lm_head_positions"], int) and s["lm_head_positions"] > 0  # observed, not assumed
        for key in SHAPE_NUMBERS:
            assert isinstance(s[key], float) and math.isfinite(s[key]) and s[key] > 0, (name, shape, key)
    return r


def test_bench_dry_run(tmp_path, capsys):
    import bench

    out = tmp_path / "result.json"
    assert bench.main(["--dry-run", "--setups", "raydrop,tutorial", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "raydrop / tutorial tokens/s" in text and "Gemma 3 4B arithmetic" in text and "MFU = model FLOPs" in text
    assert (tmp_path / bench.TABLE_FILE).read_text().startswith(bench.TABLE_HEAD)

    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    assert list(report["setups"]) == ["raydrop", "tutorial"]  # the default first
    for key in ("torch", "transformers", "peft", "accelerate"):
        assert isinstance(report["versions"][key], str), key
    assert "trl" in report["versions"] and "bitsandbytes" in report["versions"]
    assert report["device"]["name"] == "cpu" and report["device"]["peak_bf16_dense_tflops"] > 0

    ray = _check_ok_setup(report, "raydrop")
    assert set(ray["shapes"]) == {"fixed", "varied"}
    assert ray["config"] == bench.raydrop_setup()
    fixed, varied = ray["shapes"]["fixed"], ray["shapes"]["varied"]
    assert fixed["padding_share"] == 0 and fixed["tokens"] == fixed["positions"]
    assert varied["padding_share"] > 0  # real length spread, padded to the batch
    assert ray["trainer_class"].endswith("RaydropSFTTrainer on trl.SFTTrainer")
    tut = _check_ok_setup(report, "tutorial")
    assert tut["config"]["quantization"] == "4bit" and tut["quantization_applied"].startswith("none")
    # The tutorial as it ran: TRL's SFTTrainer, the model's own loss, the LM head at every position.
    assert tut["trainer_class"].endswith("SFTTrainer (stock loss)") and tut["fallback"] is None
    for s in tut["shapes"].values():
        assert s["lm_head_positions"] == s["positions"]
    assert fixed["lm_head_positions"] < fixed["tokens"]  # raydrop's loss: the head at the targets only
    assert all(isinstance(v, float) and v > 0 for v in report["ratios"].values())


def test_bench_runs_without_trl(tmp_path, monkeypatch):
    """As on a bare GPU machine: no TRL, so sft.py's trainer class on transformers' Trainer."""
    import bench

    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError
    out = tmp_path / "result.json"
    assert bench.main(["--dry-run", "--setups", "raydrop", "--shapes", "varied", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["setups"]) == ["raydrop"]
    ray = _check_ok_setup(report, "raydrop")
    assert "RaydropSFTTrainer on transformers.Trainer" in ray["trainer_class"]
    assert any("TRL not usable" in n for n in ray["trainer_notes"])
    assert report["versions"]["trl"] is None


def test_a_failing_setup_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    import bench

    real = bench.build_model

    def build(config, setup, use_gpu):
        if setup["name"] == "raydrop":
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(config, setup, use_gpu)

    monkeypatch.setattr(bench, "build_model", build)
    out = tmp_path / "result.json"
    assert bench.main(["--dry-run", "--setups", "raydrop,tutorial", "--shapes", "fixed", "--trainer", "transformers",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["setups"]["raydrop"]["status"] == "failed"
    assert "out of memory" in report["setups"]["raydrop"]["error"]
    _check_ok_setup(report, "tutorial")
    assert report["ratios"] == {"fixed": None}


def test_in_memory_4bit_quantization(tmp_path):
    """The tutorial setup's path on GPU: bf16 model quantised in memory, LoRA on bnb layers, one step."""
    pytest.importorskip("bitsandbytes")
    import torch

    import bench
    import modeling
    import sft

    config = bench.build_config(bench.TINY)
    setup = bench.tutorial_setup()
    model, _ = bench.build_model(config, dict(setup, quantization="none"), False)
    model = model.to(torch.bfloat16)
    try:
        note = bench.quantize_4bit(model, setup["attention"])
    except (NotImplementedError, RuntimeError) as e:  # a bitsandbytes without CPU kernels
        pytest.skip(f"bitsandbytes cannot quantise on CPU here: {e}")
    assert note.startswith("4bit: 26 linear layers")  # every nn.Linear of the tiny model but lm_head
    assert type(model.get_output_embeddings()) is torch.nn.Linear
    args, dropped = bench.training_arguments(bench.training_namespace(setup, 1, False), str(tmp_path), False)
    assert set(dropped) <= {"dataset_kwargs", "max_length"}
    peft_config = modeling.lora_config(setup["lora_r"], setup["lora_alpha"], setup["lora_dropout"],
                                       setup["lora_target_modules"], vision_tower=True, train_embeddings=True)
    model = bench.peft_model_like_trl(model, peft_config, args)
    q_proj = model.base_model.model.model.language_model.layers[0].self_attn.q_proj
    assert type(q_proj).__module__.startswith("peft.tuners.lora.bnb")
    batch = bench.Collate(config.image_token_index)(bench.SampleMaker(config, 40, 10).rows("varied", 2, False, 0))
    labels = batch.pop("labels")
    model.train()
    loss = sft.token_mean_loss(model(**batch), labels)
    loss.backward()
    assert math.isfinite(loss.item())


def test_tutorial_without_trl_is_trl_0_21s_training_path(tmp_path):
    """The tutorial's trainer on a machine without TRL computes what TRL 0.21's SFTTrainer does."""
    trl = pytest.importorskip("trl")
    import torch

    import bench

    config = bench.build_config(bench.TINY)
    setup = bench.tutorial_setup()
    rows = bench.SampleMaker(config, 40, 10).rows("varied", 2, False, 0)
    ns = bench.training_namespace(setup, 1, False)
    got = {}
    for name in ("trl", "replica"):
        model, _ = bench.build_model(config, dict(setup, quantization="none"), False)
        batch = bench.Collate(config.image_token_index, with_positions=False)(rows)
        if name == "trl":
            args, _ = bench.training_arguments(ns, str(tmp_path / name), with_trl=True)
            tr = trl.SFTTrainer(model=model, args=args, train_dataset=rows,
                                processing_class=bench.placeholder_tokenizer())
        else:
            args, _ = bench.training_arguments(ns, str(tmp_path / name), with_trl=False)
            tr = bench.tutorial_trainer_without_trl()(model=model, args=args, train_dataset=rows)
        tr.model.train()
        loss = tr.compute_loss(tr.model, dict(batch), num_items_in_batch=torch.tensor(7))
        acc = tr._metrics["train"]["mean_token_accuracy"] if name == "trl" else tr._token_accuracy
        got[name] = (loss.item(), tr._total_train_tokens, acc)
    assert got["replica"][0] == pytest.approx(got["trl"][0])
    assert got["replica"][1:] == got["trl"][1:]


def test_a_4bit_setup_that_cannot_quantise_falls_back_to_bf16(tmp_path, monkeypatch):
    import bench

    real = bench.build_model

    def build(config, setup, use_gpu):
        if setup["quantization"] == "4bit":
            raise RuntimeError("no bitsandbytes library for CUDA 13.0 (simulated)")
        return real(config, setup, use_gpu)

    monkeypatch.setattr(bench, "build_model", build)
    out = tmp_path / "result.json"
    assert bench.main(["--dry-run", "--setups", "raydrop,tutorial", "--shapes", "fixed", "--trainer", "transformers",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    tut = _check_ok_setup(report, "tutorial")
    assert "CUDA 13.0" in tut["fallback"] and tut["config"]["quantization"] == "4bit"
    table = (tmp_path / bench.TABLE_FILE).read_text()
    assert "tutorial in bf16: fallback, not 4-bit" in table and "FALLBACK" in table

    out2 = tmp_path / "fail.json"
    assert bench.main(["--dry-run", "--setups", "tutorial", "--shapes", "fixed", "--trainer", "transformers",
                       "--4bit-fallback", "fail", "--json", str(out2)]) == 0
    assert json.loads(out2.read_text())["setups"]["tutorial"]["status"] == "failed"


def test_gpu_command_dry_run_on_carried_wheels(tmp_path):
    """bench/gpu-run.sh as the GPU machine runs it, with --dry-run: the pack's wheels installed into a clean
    folder shadow the virtualenv's, the benchmark runs every setup and ends with valid JSON
    (make gpu-bench-dry-run, in make test, sets RAYDROP_GPU_BENCH_PACK)."""
    import subprocess

    pack = os.environ.get("RAYDROP_GPU_BENCH_PACK")
    if not pack:
        pytest.skip("RAYDROP_GPU_BENCH_PACK unset: make gpu-bench-dry-run runs this")
    site, out = tmp_path / "site", tmp_path / "out"
    env = dict(os.environ, RAYDROP_BENCH_PACK=pack, RAYDROP_BENCH_SITE=str(site), OUT=str(out),
               RAYDROP_BENCH_PYTHON=os.environ.get("RAYDROP_BENCH_PYTHON", sys.executable))
    env.pop("PYTHONPATH", None)
    script = os.path.join(TRAINER_DIR, "bench", "gpu-run.sh")
    proc = subprocess.run(["bash", script, "--dry-run"], cwd=os.path.dirname(TRAINER_DIR), env=env,
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    assert "gpu-run: wheels installed" in proc.stdout and "benchmark finished (exit 0)" in proc.stdout

    import bench

    report = json.loads((out / "bench-result.json").read_text())
    assert report["dry_run"] is True and report["mfu_convention"] == bench.MFU_CONVENTION
    v = report["versions"]
    assert v["stack"].startswith(f"carried wheels in {site}")
    assert (v["transformers"], v["tokenizers"], v["peft"], v["accelerate"]) == ("4.55.2", "0.21.4", "0.17.0",
                                                                                 "1.10.0")
    for name, folder in v["files"].items():
        if name != "bitsandbytes":
            assert os.path.realpath(folder).startswith(os.path.realpath(site)), (name, folder)
    assert v["trl"] is None  # the machine has no TRL: the dry run takes the same path
    assert list(report["setups"]) == ["raydrop", "tutorial"] + [s["name"] for s in bench.ablation_setups()]
    for name in report["setups"]:
        _check_ok_setup(report, name)
    assert "tutorial+raydrop-loss" in (out / "bench-table.txt").read_text()
