"""Training throughput and MFU on one GPU: the tutorial's setup against raydrop's default.

Builds Gemma 3 4B from its real configuration with random weights (no
download: the weights do not change the work done), saves it once, then for
each setup loads it through the trainer's own model loading, LoRA and
RaydropSFTTrainer code and times optimizer steps on synthetic samples shaped
like the tutorial's (412 positions: ~152 text tokens and one 896x896 image's
260-token block). Data loading is not timed.

    python bench/bench.py                 # on a CUDA machine (make trainer-bench)
    python bench/bench.py --dry-run       # tiny model on CPU: code path and arithmetic only
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import flops  # noqa: E402

# google/gemma-3-4b-it's config.json (other fields take the transformers defaults).
GEMMA3_4B = {
    "text": dict(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=1024, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6, max_position_embeddings=131072,
    ),
    "vision": dict(
        hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
        image_size=896, patch_size=14, vision_use_head=False,
    ),
    "top": dict(mm_tokens_per_image=256, boi_token_index=255999, eoi_token_index=256000, image_token_index=262144),
}
TINY = {
    "text": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=64,
        layer_types=["sliding_attention", "full_attention"], rope_scaling=None, max_position_embeddings=1024,
    ),
    "vision": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   image_size=32, patch_size=8, vision_use_head=False),
    "top": dict(mm_tokens_per_image=4, boi_token_index=300, eoi_token_index=301, image_token_index=302),
}

# Dense BF16 tensor-core peaks, FLOP/s.
PEAKS = {"B200": 2250e12, "H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}

TUTORIAL = dict(name="tutorial", quantization="4bit", attention="eager", lora_vision_tower=True,
                train_embeddings=True, completion_only_loss=False, gradient_checkpointing=True,
                per_device_batch_size=1, gradient_accumulation_steps=4)


def raydrop_setup(batch: int) -> Dict[str, Any]:
    return dict(name="raydrop", quantization="none", attention="sdpa", lora_vision_tower=False,
                train_embeddings=False, completion_only_loss=True, gradient_checkpointing=False,
                per_device_batch_size=batch, gradient_accumulation_steps=1)


def build_config(spec):
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    return Gemma3Config(text_config=Gemma3TextConfig(**spec["text"]).to_dict(),
                        vision_config=SiglipVisionConfig(**spec["vision"]).to_dict(), **spec["top"])


def save_random_model(config, path: str, device: str) -> None:
    import torch
    from transformers import Gemma3ForConditionalGeneration

    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Gemma3ForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(prev)
    model.save_pretrained(path)
    del model


def placeholder_tokenizer():
    """SFTTrainer wants a processing class; the batches below are already token ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>")


def samples(config, n: int, text_tokens: int, completion_tokens: int, completion_only: bool) -> List[Dict]:
    """Fixed-length samples: bos, prompt text, image block (\\n\\n boi image*N eoi \\n\\n), answer."""
    import torch

    top = config
    mm = top.mm_tokens_per_image
    img = top.vision_config.image_size
    nl = 10  # any ordinary id stands in for "\n\n"
    g = torch.Generator().manual_seed(0)
    out = []
    prompt_text = text_tokens - completion_tokens - 1
    for _ in range(n):
        text = torch.randint(20, 250, (prompt_text + completion_tokens,), generator=g)
        block = torch.tensor([nl, top.boi_token_index] + [top.image_token_index] * mm + [top.eoi_token_index, nl])
        ids = torch.cat([torch.tensor([2]), text[:prompt_text], block, text[prompt_text:]])
        labels = ids.clone()
        if completion_only:
            labels[: len(ids) - completion_tokens] = -100
        else:
            labels[(ids == top.image_token_index) | (ids == top.boi_token_index)] = -100
        labels[0] = -100
        out.append({
            "input_ids": ids, "attention_mask": torch.ones_like(ids),
            "token_type_ids": (ids == top.image_token_index).long(), "labels": labels,
            "pixel_values": torch.randn(3, img, img, generator=g),
        })
    return out


def collate(rows):
    import torch

    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def run_setup(setup, args, config, model_dir, use_gpu) -> Dict[str, Any]:
    import torch
    from transformers import TrainerCallback

    import modeling
    import sft
    import worker

    quant = setup["quantization"] if use_gpu else "none"
    device = "cuda:0" if use_gpu else None
    model = modeling.load_model(model_dir, quant, setup["attention"], use_gpu, device)
    steps = args.warmup + args.steps
    per_step = setup["per_device_batch_size"] * setup["gradient_accumulation_steps"]
    rows = samples(config, steps * per_step, args.text_tokens, args.completion_tokens,
                   setup["completion_only_loss"])
    ns = argparse.Namespace(
        epochs=1, max_steps=steps, per_device_batch_size=setup["per_device_batch_size"],
        gradient_accumulation_steps=setup["gradient_accumulation_steps"],
        gradient_checkpointing=setup["gradient_checkpointing"], learning_rate=2e-4, lr_scheduler="constant",
        warmup_ratio=0.0, max_grad_norm=0.3, logging_steps=10_000, save_strategy="no", save_steps=10_000,
        use_gpu=use_gpu, seed=42, max_seq_length=4096, dataloader_num_workers=0,
    )
    out_dir = tempfile.mkdtemp(prefix="raydrop-bench-")
    cfg = worker.sft_config(ns, out_dir)
    cfg.dataloader_persistent_workers = False

    marks: Dict[str, float] = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                if use_gpu:
                    torch.cuda.synchronize()
                marks["start"] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if state.global_step == steps:
                if use_gpu:
                    torch.cuda.synchronize()
                marks["end"] = time.perf_counter()

    trainer = sft.trainer_class()(
        model=model, args=cfg, train_dataset=rows, processing_class=placeholder_tokenizer(),
        data_collator=collate, peft_config=modeling.lora_config(
            16, 16, 0.05, "all-linear", vision_tower=setup["lora_vision_tower"],
            train_embeddings=setup["train_embeddings"]),
        callbacks=[Timer()],
    )
    if use_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    seconds = marks["end"] - marks["start"]
    n_samples = args.steps * per_step
    tokens = n_samples * len(rows[0]["input_ids"])
    res = {"setup": setup["name"], "quantization": quant, "seconds": seconds, "samples": n_samples,
           "tokens": tokens, "tokens_per_second": tokens / seconds, "samples_per_second": n_samples / seconds,
           "positions": len(rows[0]["input_ids"]),
           "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30) if use_gpu else 0.0}
    del trainer, model
    gc.collect()
    if use_gpu:
        torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny model on CPU, 1 timed step")
    p.add_argument("--steps", type=int, default=6, help="timed optimizer steps per setup")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first")
    p.add_argument("--raydrop-batch", type=int, default=8, help="per-device batch of the raydrop setup")
    p.add_argument("--text-tokens", type=int, default=152, help="text tokens per sample (besides the image block)")
    p.add_argument("--completion-tokens", type=int, default=60, help="answer tokens per sample")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense BF16 peak; default from the GPU name")
    p.add_argument("--model-dir", default="", help="where the random 4B model is saved (reused)")
    args = p.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    use_gpu = torch.cuda.is_available() and not args.dry_run
    if not use_gpu and not args.dry_run:
        print("no CUDA GPU: run with --dry-run for the CPU check", file=sys.stderr)
        return 2
    if args.dry_run:
        args.steps, args.warmup, args.text_tokens, args.completion_tokens = 1, 1, 40, 10
    spec = TINY if args.dry_run else GEMMA3_4B
    config = build_config(spec)
    gpu = torch.cuda.get_device_name(0) if use_gpu else "cpu"
    peak = args.peak_tflops * 1e12
    if not peak:
        peak = next((v for k, v in PEAKS.items() if k in gpu), 0.0) if use_gpu else 1e12
    if not peak:
        print(f"unknown peak for {gpu!r}: pass --peak-tflops", file=sys.stderr)
        return 2

    model_dir = args.model_dir or os.path.join(
        tempfile.gettempdir(), "raydrop-bench-tiny" if args.dry_run else "raydrop-bench-gemma3-4b")
    print(f"device: {gpu}; dense BF16 peak {peak / 1e12:,.1f} TFLOP/s; model at {model_dir}", flush=True)
    save_random_model(config, model_dir, "cuda" if use_gpu else "cpu")

    g = flops.dims(config)
    results = []
    for setup in (TUTORIAL, raydrop_setup(args.raydrop_batch)):
        print(f"\n== {setup['name']}: " + ", ".join(f"{k}={v}" for k, v in setup.items() if k != "name"), flush=True)
        res = run_setup(setup, args, config, model_dir, use_gpu)
        fig, lines = flops.flops_per_sample(
            g, res["positions"], 1, 16, vision_lora=setup["lora_vision_tower"],
            train_lm_head=setup["train_embeddings"], grad_ckpt=setup["gradient_checkpointing"])
        for line in lines:
            print("  " + line)
        achieved = fig["model_flops"] * res["samples_per_second"]
        res.update(model_flops_per_sample=fig["model_flops"], achieved=achieved, mfu=achieved / peak,
                   hfu=fig["hardware_flops"] * res["samples_per_second"] / peak)
        print(f"  {res['samples']} samples x {res['positions']} positions in {res['seconds']:.2f} s = "
              f"{res['tokens_per_second']:,.0f} tokens/s ({res['samples_per_second']:.3f} samples/s), "
              f"peak memory {res['peak_memory_gib']:.1f} GiB")
        print(f"  MFU = {fig['model_flops']:.3e} FLOP x {res['samples_per_second']:.3f} samples/s / "
              f"{peak:.3e} FLOP/s = {100 * res['mfu']:.2f} % (HFU {100 * res['hfu']:.2f} %)", flush=True)
        results.append(res)

    tut, ray = results
    print("\nsetup      tokens/s/GPU      MFU")
    for r in results:
        print(f"{r['setup']:<10} {r['tokens_per_second']:>12,.0f} {100 * r['mfu']:>8.2f} %")
    ratio = ray["tokens_per_second"] / tut["tokens_per_second"]
    print(f"raydrop / tutorial tokens/s = {ratio:.1f}x (target >= 20x); raydrop MFU {100 * ray['mfu']:.1f} % "
          f"(target >= 40 %)" + ("  [dry run: figures mean nothing]" if args.dry_run else ""))
    if args.dry_run:
        g4 = flops.dims(build_config(GEMMA3_4B))
        for setup in (TUTORIAL, raydrop_setup(args.raydrop_batch)):
            fig, lines = flops.flops_per_sample(g4, 412, 1, 16, vision_lora=setup["lora_vision_tower"],
                                                train_lm_head=setup["train_embeddings"],
                                                grad_ckpt=setup["gradient_checkpointing"])
            print(f"\nGemma 3 4B arithmetic, {setup['name']} setup, 412 positions + one 896x896 image:")
            for line in lines:
                print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
