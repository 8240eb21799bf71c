"""Model FLOPs of one Gemma 3 LoRA training sample, term by term.

Convention (as in NeMo AutoModel's PEFT MFU): a matmul with N weights costs
2N FLOPs per token forward; backward costs 2N for the activation gradient,
plus 2N for the weight gradient only where the weight is trainable. Frozen
towers that need no input gradient (the vision tower without adapters) have
no backward at all. Attention scores and values cost 4*T^2*width forward per
layer (the full T x T matrix: the image-bidirectional mask rules out causal
skipping) and twice that backward. Gradient-checkpointing recompute is
hardware work, not model work: it enters HFU, not MFU. The LM head can
run at fewer positions than the decoder (a loss that needs logits only
where there is a target): head_positions says how many; by default all.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple


def dims(config) -> Dict[str, int]:
    t, v = config.text_config, config.vision_config
    return {
        "d": t.hidden_size, "f": t.intermediate_size, "L": t.num_hidden_layers, "h": t.num_attention_heads,
        "kv": t.num_key_value_heads, "hd": t.head_dim, "V": t.vocab_size,
        "dv": v.hidden_size, "fv": v.intermediate_size, "Lv": v.num_hidden_layers,
        "P": (v.image_size // v.patch_size) ** 2, "mm": config.mm_tokens_per_image,
    }


def flops_per_sample(
    g: Dict[str, int],
    text_positions: float,
    images: int = 1,
    lora_r: int = 16,
    vision_lora: bool = False,
    train_lm_head: bool = False,
    grad_ckpt: bool = False,
    head_positions: Optional[float] = None,
) -> Tuple[Dict[str, float], List[str]]:
    """(figures, explanation lines) for one sample of text_positions tokens (image tokens included)."""
    T, d, q, kv = text_positions, g["d"], g["h"] * g["hd"], g["kv"] * g["hd"]
    H = T if head_positions is None else head_positions
    text_layer = d * q + 2 * d * kv + q * d + 3 * d * g["f"]
    n_text = g["L"] * text_layer
    n_head = g["V"] * d
    vis_layer = 4 * g["dv"] ** 2 + 2 * g["dv"] * g["fv"]
    n_vis = g["Lv"] * vis_layer
    P = g["P"] * images
    r = lora_r
    lora_text = g["L"] * r * ((d + q) + 2 * (d + kv) + (q + d) + 2 * (d + g["f"]) + (g["f"] + d))
    lora_vis = g["Lv"] * r * (4 * 2 * g["dv"] + 2 * (g["dv"] + g["fv"])) if vision_lora else 0

    fwd_text = 2 * (n_text * T + n_head * H)
    fwd_text_attn = 4 * T * T * q * g["L"]
    fwd_vis = 2 * n_vis * P
    fwd_vis_attn = 4 * g["P"] ** 2 * g["dv"] * g["Lv"] * images
    fwd_proj = 2 * g["dv"] * d * g["mm"] * images
    fwd_lora = 2 * lora_text * T + 2 * lora_vis * P
    fwd = fwd_text + fwd_text_attn + fwd_vis + fwd_vis_attn + fwd_proj + fwd_lora

    bwd_text = fwd_text + 2 * fwd_text_attn + 4 * lora_text * T
    bwd_head_w = 2 * n_head * H if train_lm_head else 0
    bwd_vis = (2 * n_vis * P + 2 * fwd_vis_attn + 4 * lora_vis * P + fwd_proj) if vision_lora else 0
    bwd = bwd_text + bwd_head_w + bwd_vis
    recompute = 0
    if grad_ckpt:
        recompute = 2 * n_text * T + fwd_text_attn + 2 * lora_text * T
        if vision_lora:
            recompute += fwd_vis + fwd_vis_attn + 2 * lora_vis * P

    model = fwd + bwd
    fig = {
        "text_params": n_text, "lm_head_params": n_head, "vision_params": n_vis,
        "lora_params": lora_text + lora_vis, "forward": fwd, "backward": bwd, "recompute": recompute,
        "model_flops": model, "hardware_flops": model + recompute,
    }
    e = "{:.3e}".format
    lines = [
        f"decoder linear params {g['L']} x {text_layer:,} = {n_text:,}; lm_head {g['V']:,} x {d:,} = {n_head:,}",
        f"vision linear params {g['Lv']} x {vis_layer:,} = {n_vis:,}; {g['P']:,} patches per image; "
        f"LoRA params {lora_text + lora_vis:,} (vision {lora_vis:,})",
        (f"fwd text linear 2 x {n_text + n_head:,} x {T:g} = {e(fwd_text)}" if H == T else
         f"fwd text linear 2 x {n_text:,} x {T:g} + lm_head 2 x {n_head:,} x {H:g} = {e(fwd_text)}"),
        f"fwd text attention 4 x {T:g}^2 x {q} x {g['L']} = {e(fwd_text_attn)}",
        f"fwd vision linear 2 x {n_vis:,} x {P:,} = {e(fwd_vis)}",
        f"fwd vision attention 4 x {g['P']:,}^2 x {g['dv']} x {g['Lv']} x {images} = {e(fwd_vis_attn)}",
        f"fwd projector + LoRA = {e(fwd_proj + fwd_lora)}",
        f"bwd text (activation grads + 2 x attention + LoRA grads) = {e(bwd_text)}",
        f"bwd lm_head weight grad (trainable copy) = {e(bwd_head_w)}",
        f"bwd vision ({'adapters: activation grads + 2 x attention' if vision_lora else 'frozen, no adapters: none'})"
        f" = {e(bwd_vis)}",
        f"model FLOPs per sample = fwd {e(fwd)} + bwd {e(bwd)} = {e(model)}"
        f"; gradient-checkpoint recompute {e(recompute)} (HFU only)",
    ]
    return fig, lines
