"""Model loading and the LoRA configuration.

The Hugging Face token, when needed, is read by huggingface_hub from the
HF_TOKEN environment variable; it is never passed around or logged here.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from cli import lora_target_modules

# Module names under which Gemma3ForConditionalGeneration keeps its SigLIP
# encoder (transformers 4.55: model.vision_tower.vision_model...).
VISION_TOWER_PATTERN = r".*vision_tower.*"


def model_kwargs(quantization: str, attention: str, use_gpu: bool, device: Any = None) -> Dict[str, Any]:
    """from_pretrained keyword arguments for the chosen precision and attention."""
    import torch

    dtype = torch.bfloat16 if use_gpu else torch.float32
    kwargs: Dict[str, Any] = {"attn_implementation": attention, "torch_dtype": dtype}
    if quantization == "4bit":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_quant_storage=dtype,
        )
        if device is not None:
            # bitsandbytes quantises while loading onto the device.
            kwargs["device_map"] = {"": device}
    elif quantization != "none":
        raise ValueError(f"unknown quantization {quantization!r}")
    return kwargs


def load_model(model_id: str, quantization: str, attention: str, use_gpu: bool, device: Any = None,
               revision: Optional[str] = None):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(
        model_id, revision=revision, **model_kwargs(quantization, attention, use_gpu, device)
    )
    model.config.use_cache = False
    if getattr(model.config, "text_config", None) is not None:
        model.config.text_config.use_cache = False
    return model


def lora_config(
    r: int,
    alpha: int,
    dropout: float,
    target_modules: str = "all-linear",
    vision_tower: bool = False,
    train_embeddings: bool = False,
    exclude_pattern: Optional[str] = None,
):
    """PEFT LoRA config.

    vision_tower=False keeps the (frozen, Gemma-pretrained) SigLIP encoder free
    of adapters: its 4,096-patch sequence then needs no backward pass at all.
    train_embeddings=True reproduces the tutorial's modules_to_save, i.e. full
    trainable copies of the 262k-row embedding and LM head (about 1.3 B
    parameters, saved in every checkpoint).
    """
    from peft import LoraConfig

    kwargs: Dict[str, Any] = dict(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        bias="none",
        target_modules=lora_target_modules(target_modules),
        task_type="CAUSAL_LM",
    )
    if not vision_tower:
        kwargs["exclude_modules"] = exclude_pattern or VISION_TOWER_PATTERN
    if train_embeddings:
        kwargs["modules_to_save"] = ["lm_head", "embed_tokens"]
    return LoraConfig(**kwargs)
