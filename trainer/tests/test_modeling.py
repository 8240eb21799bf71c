"""Model loading options and the LoRA configuration."""

from __future__ import annotations

import pytest

import modeling


@pytest.fixture(scope="module")
def base(assets):
    return lambda attention="sdpa": modeling.load_model(assets["model"], "none", attention, use_gpu=False)


def _trainable(model, cfg):
    from peft import get_peft_model

    peft_model = get_peft_model(model, cfg)
    return [n for n, p in peft_model.named_parameters() if p.requires_grad]


def test_default_lora_leaves_vision_tower_and_embeddings_alone(base):
    names = _trainable(base(), modeling.lora_config(8, 16, 0.05))
    assert names and all("lora_" in n for n in names)
    assert not [n for n in names if "vision_tower" in n]
    assert [n for n in names if "language_model" in n]


def test_tutorial_lora_choices(base):
    names = _trainable(base(), modeling.lora_config(8, 16, 0.05, vision_tower=True, train_embeddings=True))
    assert [n for n in names if "vision_tower" in n and "lora_" in n]
    assert [n for n in names if "embed_tokens" in n and "modules_to_save" in n]
    assert [n for n in names if "lm_head" in n and "modules_to_save" in n]


def test_attention_choice_applies(base):
    assert base("sdpa").config._attn_implementation == "sdpa"
    assert base("eager").config._attn_implementation == "eager"


def test_4bit_kwargs_are_the_tutorials():
    kw = modeling.model_kwargs("4bit", "eager", use_gpu=True, device="cuda:0")
    q = kw["quantization_config"]
    assert q.load_in_4bit and q.bnb_4bit_use_double_quant and q.bnb_4bit_quant_type == "nf4"
    assert kw["device_map"] == {"": "cuda:0"}
    assert "quantization_config" not in modeling.model_kwargs("none", "sdpa", use_gpu=True)
