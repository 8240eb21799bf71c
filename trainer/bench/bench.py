"""Training throughput and MFU on one GPU: raydrop's default setup against the tutorial's.

Builds Gemma 3 4B (vision tower included) from its real configuration with
random weights, in memory on the GPU (no download, nothing saved: the weights
do not change the work done), wraps it with the trainer's LoRA config
(modeling.lora_config) and trains it with the trainer's own loss and
TrainingArguments (sft.py, worker.sft_config). For each setup it times
optimizer steps on two kinds of synthetic samples:

* fixed:  the tutorial's shape, 412 positions per sample (bos + 151 text
          tokens + the 260-position block of one 896x896 image), no padding;
* varied: prompt and answer lengths drawn with a fixed seed around the
          tutorial's means, padded to the longest sample of each batch and to
          a multiple of 8 as the trainer's collator does on GPU.

Tokens are counted without padding. Data loading is not timed.

    python bench/bench.py                 # one CUDA GPU (make trainer-bench)
    python bench/bench.py --dry-run       # tiny model on CPU: code path and arithmetic only

The raydrop setup is the trainer's default (cli.DEFAULTS and the flag
defaults) with its own loss (sft.py: the LM head only at the targets). The
tutorial setup is cli.TUTORIAL_MODEL_CHOICES with batch 1 x gradient
accumulation 4, trained as the tutorial was: the stock loss (the model's own,
from full-vocabulary logits up-cast to fp32) and TRL 0.21 SFTTrainer's
per-micro-batch metrics. The tutorial+<change> rows apply one of raydrop's
changes at a time. Neither TRL, datasets nor Ray is needed: without TRL both
losses run on transformers' Trainer. The JSON result names the library
versions, where they were imported from, and the trainer class that ran.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import importlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import flops  # noqa: E402

# google/gemma-3-4b-it's config.json (the other fields take the transformers
# defaults, as when the Hub file is loaded). This is the Hub format, which
# transformers 4.x and 5.x both read (5.x turns rope_scaling, rope_theta and
# rope_local_base_freq into its per-layer-type rope_parameters).
GEMMA3_4B = {
    "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
    },
    "vision_config": {
        "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "num_attention_heads": 16,
        "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False,
    },
    "mm_tokens_per_image": 256, "boi_token_index": 255999, "eoi_token_index": 256000,
    "image_token_index": 262144, "eos_token_id": [1, 106], "initializer_range": 0.02,
}
TINY = {
    "text_config": {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 32,
        "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 1024,
    },
    "vision_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "image_size": 32, "patch_size": 8, "vision_use_head": False,
    },
    "mm_tokens_per_image": 4, "boi_token_index": 300, "eoi_token_index": 301, "image_token_index": 302,
}

# Dense (no sparsity) BF16 tensor-core peak per GPU, TFLOP/s, by the exact
# name torch.cuda.get_device_name() reports. The NVIDIA datasheets named
# beside each print the "with sparsity" BF16 figure: twice the dense one.
PEAK_BF16_DENSE_TFLOPS = {
    # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM BF16 1,979 TFLOPS with sparsity; dense 989.4
    # (the NVIDIA H100 Tensor Core GPU architecture whitepaper's 989.4/1,978.9).
    "NVIDIA H100 80GB HBM3": 989.4,
    # Same datasheet: H100 PCIe BF16 1,513 TFLOPS with sparsity -> 756 dense.
    "NVIDIA H100 PCIe": 756.0,
    # Same datasheet: H100 NVL BF16 1,671 TFLOPS with sparsity (per GPU) -> 835 dense.
    "NVIDIA H100 NVL": 835.0,
    # NVIDIA H200 Tensor Core GPU datasheet: H200 SXM BF16 1,979 TFLOPS with sparsity -> 989.4 dense.
    "NVIDIA H200": 989.4,
    # Same datasheet: H200 NVL BF16 1,671 TFLOPS with sparsity -> 835 dense.
    "NVIDIA H200 NVL": 835.0,
    # NVIDIA HGX B200 datasheet: BF16 4.5 PFLOPS with sparsity per GPU -> 2,250 dense.
    "NVIDIA B200": 2250.0,
    # NVIDIA GB200 NVL72 datasheet: BF16 per GPU 5 PFLOPS with sparsity -> 2,500 dense.
    "NVIDIA GB200": 2500.0,
    # NVIDIA A100 Tensor Core GPU datasheet: BF16 624 TFLOPS with sparsity -> 312 dense (all four variants).
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
}

SHAPES = ("fixed", "varied")
# The varied shape: prompt text ~ normal around the tutorial's mean with this
# relative spread; answer ~ log-normal around the tutorial's mean with this
# coefficient of variation; both clipped; padded like data.Collator on GPU.
PROMPT_REL_SD = 0.13
ANSWER_CV = 0.5
PAD_TO_MULTIPLE_OF = 8
PAD_ID = 0
BOS_ID = 2
NL_ID = 10  # any ordinary id stands in for "\n\n" around the image block
VARIED_SEED = 1234
RESULT_FILE = "bench-result.json"
TABLE_FILE = "bench-table.txt"


# --------------------------------------------------------------------------- setups


def _parser_defaults() -> Dict[str, Any]:
    """Every flag's default value, as the trainer would run without flags."""
    import cli

    # --storage-path is the one required flag; its value plays no part here.
    return vars(cli.build_parser().parse_args(["--storage-path", tempfile.gettempdir()]))


def raydrop_setup() -> Dict[str, Any]:
    """The trainer's default: step shape from cli.DEFAULTS, model choices and LoRA from the flag defaults."""
    import cli

    d = _parser_defaults()
    setup: Dict[str, Any] = {"name": "raydrop"}
    for key in cli.TUTORIAL_MODEL_CHOICES:
        setup[key] = d[key]
    setup.update(
        per_device_batch_size=cli.DEFAULTS["perDeviceBatchSize"],
        gradient_accumulation_steps=cli.DEFAULTS["gradientAccumulationSteps"],
        gradient_checkpointing=cli.DEFAULTS["gradientCheckpointing"],
        loss="raydrop",
    )
    setup.update(_lora_settings(d))
    return setup


def tutorial_setup() -> Dict[str, Any]:
    """The reference tutorial as it ran: cli.TUTORIAL_MODEL_CHOICES, batch 1 x gradient accumulation 4,
    and the stock loss (the model's own, from full fp32 logits, as TRL 0.21's SFTTrainer computes it)."""
    import cli

    setup: Dict[str, Any] = {"name": "tutorial"}
    setup.update(cli.TUTORIAL_MODEL_CHOICES)
    setup.update(per_device_batch_size=1, gradient_accumulation_steps=4, loss="stock")
    setup.update(_lora_settings(_parser_defaults()))
    return setup


# Short names of raydrop's changes to the tutorial; "batch" is batch size and
# gradient accumulation together (one change: the step's samples stay the same).
CHANGE_NAMES = {
    "quantization": "bf16", "attention": "sdpa", "lora_vision_tower": "text-lora",
    "train_embeddings": "frozen-head", "gradient_checkpointing": "no-ckpt",
    "completion_only_loss": "answer-only", "batch": "batch", "loss": "raydrop-loss",
}


def ablation_setups() -> List[Dict[str, Any]]:
    """The tutorial with one of raydrop's changes at a time, named tutorial+<change>.

    Derived from the two setups: every key where raydrop's default differs
    from the tutorial is one row, so a change of defaults changes the rows.
    """
    tut, ray = tutorial_setup(), raydrop_setup()
    out = []
    for key, short in CHANGE_NAMES.items():
        keys = ("per_device_batch_size", "gradient_accumulation_steps") if key == "batch" else (key,)
        if all(tut[k] == ray[k] for k in keys):
            continue
        s = dict(tut, name=f"tutorial+{short}")
        s.update({k: ray[k] for k in keys})
        out.append(s)
    return out


def all_setups() -> Dict[str, Dict[str, Any]]:
    out = {"raydrop": raydrop_setup(), "tutorial": tutorial_setup()}
    out.update({s["name"]: s for s in ablation_setups()})
    return out


def _lora_settings(d: Dict[str, Any]) -> Dict[str, Any]:
    # The tutorial's LoraConfig has the same r, alpha, dropout and "all-linear" targets.
    return {k: d[k] for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")}


# --------------------------------------------------------------------------- GPU peak and versions


def peak_flops(gpu_name: str, override_tflops: float, dry_run: bool) -> Tuple[Optional[float], str]:
    """(dense BF16 peak in FLOP/s or None, where it comes from)."""
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    if dry_run:
        return 1e12, "dry run: placeholder of 1 TFLOP/s (the CPU figures mean nothing)"
    tflops = PEAK_BF16_DENSE_TFLOPS.get(gpu_name.strip())
    if tflops is None:
        return None, (f"unknown GPU {gpu_name!r}: MFU and HFU are null; pass --peak-tflops with its dense "
                      f"BF16 peak (known: {', '.join(sorted(PEAK_BF16_DENSE_TFLOPS))})")
    return tflops * 1e12, f"datasheet table in bench.py ({gpu_name}: {tflops:g} TFLOP/s dense BF16)"


def _installed_version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


STACK_MODULES = ("transformers", "tokenizers", "huggingface_hub", "peft", "accelerate")


def library_versions() -> Dict[str, Any]:
    """Versions that ran, and where each was imported from (the carried wheels' folder or the machine's own).

    trl is null unless this process imported it (the TRL trainer ran);
    bitsandbytes is the installed version, imported only by the 4-bit setups.
    """
    import torch

    out: Dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda}
    files: Dict[str, Optional[str]] = {}
    for name in STACK_MODULES:
        try:
            mod = importlib.import_module(name)
            out[name] = mod.__version__
            files[name] = os.path.dirname(mod.__file__ or "")
        except Exception as e:  # reported, not fatal: the setups then fail with the same error
            out[name] = None
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"
    trl = sys.modules.get("trl")
    out["trl"] = getattr(trl, "__version__", None) if isinstance(trl, types.ModuleType) else None
    out["trl_installed"] = _installed_version("trl")
    out["bitsandbytes"] = _installed_version("bitsandbytes")
    bnb = sys.modules.get("bitsandbytes")
    files["bitsandbytes"] = os.path.dirname(bnb.__file__) if isinstance(bnb, types.ModuleType) else None
    out["files"] = files
    # Set by gpu-run.sh: which stack it installed ("carried" wheels, or the machine's own and why).
    out["stack"] = os.environ.get("RAYDROP_BENCH_STACK", "as installed (not run through gpu-run.sh)")
    return out


def _transformers_at_least(major: int, minor: int) -> bool:
    import transformers

    parts = []
    for p in transformers.__version__.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= (major, minor)


# --------------------------------------------------------------------------- model


def build_config(spec: Dict[str, Any]):
    from transformers import Gemma3Config

    return Gemma3Config(**copy.deepcopy(spec))


def build_model(config, setup: Dict[str, Any], use_gpu: bool):
    """Gemma3ForConditionalGeneration with random weights, built in place on the device.

    bf16 on GPU (fp32 on CPU), as modeling.model_kwargs chooses; 4-bit setups
    are then quantised in memory (quantize_4bit). use_cache is switched off as
    modeling.load_model does.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    dtype = torch.bfloat16 if use_gpu else torch.float32
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
    # transformers >= 4.56 names the argument dtype (torch_dtype is deprecated, later removed).
    dtype_kw = "dtype" if _transformers_at_least(4, 56) else "torch_dtype"
    torch.manual_seed(0)
    with device:
        model = AutoModelForImageTextToText.from_config(
            copy.deepcopy(config), attn_implementation=setup["attention"], **{dtype_kw: dtype})
    model.config.use_cache = False
    if getattr(model.config, "text_config", None) is not None:
        model.config.text_config.use_cache = False
    note = "none"
    if setup["quantization"] == "4bit":
        if not use_gpu:
            note = "none (dry run on CPU: bitsandbytes 4-bit needs CUDA)"
        else:
            note = quantize_4bit(model, setup["attention"])
    elif setup["quantization"] != "none":
        raise ValueError(f"unknown quantization {setup['quantization']!r}")
    return model, note


def quantize_4bit(model, attention: str) -> str:
    """Swap every nn.Linear but the output embedding for a bitsandbytes Linear4bit, in memory.

    The settings are the trainer's (modeling.model_kwargs' BitsAndBytesConfig:
    NF4, double quantisation, bf16 compute and storage). from_pretrained
    builds Linear4bit layers while loading instead; like its bitsandbytes
    integration, this leaves the (tied) output embedding lm_head unquantised.
    """
    import importlib.util

    import torch

    import modeling

    if importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError("bitsandbytes is not installed: the 4-bit setup cannot run here")
    import bitsandbytes as bnb

    q = modeling.model_kwargs("4bit", attention, True)["quantization_config"]
    keep = model.get_output_embeddings()
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is keep:
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features, child.out_features, bias=child.bias is not None,
                compute_dtype=q.bnb_4bit_compute_dtype, compress_statistics=q.bnb_4bit_use_double_quant,
                quant_type=q.bnb_4bit_quant_type, quant_storage=q.bnb_4bit_quant_storage, device="meta",
            )
            weight = bnb.nn.Params4bit(
                child.weight.data, requires_grad=False, compress_statistics=q.bnb_4bit_use_double_quant,
                quant_type=q.bnb_4bit_quant_type, quant_storage=q.bnb_4bit_quant_storage, module=layer,
            )
            layer.weight = weight.to(child.weight.device)  # quantises
            if child.bias is not None:
                layer.bias = child.bias
            setattr(parent, name, layer)
            replaced += 1
    # What PEFT (bnb LoRA layers), TRL (prepare_model_for_kbit_training) and the Trainer (no .to())
    # look at to treat the model as a bitsandbytes 4-bit one.
    flags = []
    try:
        model.is_loaded_in_4bit = True
    except AttributeError as e:  # a transformers where it is a read-only property
        flags.append(f"is_loaded_in_4bit not settable ({e})")
    try:
        from transformers.utils.quantization_config import QuantizationMethod

        model.quantization_method = QuantizationMethod.BITS_AND_BYTES
    except Exception as e:
        flags.append(f"quantization_method not set ({type(e).__name__}: {e})")
    gc.collect()
    torch.cuda.empty_cache()
    return (f"4bit: {replaced} linear layers as bitsandbytes Linear4bit {q.bnb_4bit_quant_type}, double quant "
            f"{q.bnb_4bit_use_double_quant}, quantised in memory (bitsandbytes {bnb.__version__})"
            + "".join(f"; {f}" for f in flags))


# --------------------------------------------------------------------------- samples


def padded_width(lengths: Sequence[int], multiple: Optional[int]) -> int:
    width = max(lengths)
    if multiple:
        width = (width + multiple - 1) // multiple * multiple
    return width


class SampleMaker:
    """Synthetic samples laid out like data.Collator's: bos, prompt text, image block, answer."""

    def __init__(self, config, text_tokens: int, answer_tokens: int):
        import torch

        self.config = config
        self.prompt_mean = text_tokens - answer_tokens - 1  # bos is the first text token
        self.answer_mean = answer_tokens
        self.image_id = config.image_token_index
        self.block = [NL_ID, config.boi_token_index] + [self.image_id] * config.mm_tokens_per_image + [
            config.eoi_token_index, NL_ID]
        img = config.vision_config.image_size
        g = torch.Generator().manual_seed(0)
        # Pixel values do not change the work done; a few distinct images bound host memory.
        self.images = [torch.randn(3, img, img, generator=g) for _ in range(4)]

    def lengths(self, shape: str, n: int) -> List[Tuple[int, int]]:
        """(prompt text tokens, answer tokens) per sample."""
        if shape == "fixed":
            return [(self.prompt_mean, self.answer_mean)] * n
        import torch

        g = torch.Generator().manual_seed(VARIED_SEED)
        sigma = math.sqrt(math.log(1 + ANSWER_CV ** 2))
        mu = math.log(self.answer_mean) - sigma ** 2 / 2
        out = []
        for _ in range(n):
            zp, za = torch.randn(2, generator=g).tolist()
            p = round(self.prompt_mean * (1 + PROMPT_REL_SD * zp))
            a = round(math.exp(mu + sigma * za))
            p = min(max(p, max(1, self.prompt_mean // 2)), 2 * self.prompt_mean)
            a = min(max(a, max(1, self.answer_mean // 5)), 4 * self.answer_mean)
            out.append((p, a))
        return out

    def rows(self, shape: str, n: int, completion_only: bool, first_index: int) -> List[Dict[str, Any]]:
        import torch

        g = torch.Generator().manual_seed(first_index + 7)
        out = []
        for i, (p, a) in enumerate(self.lengths(shape, n)):
            text = torch.randint(20, 250, (p + a,), generator=g)
            ids = torch.cat([torch.tensor([BOS_ID]), text[:p], torch.tensor(self.block), text[p:]])
            labels = ids.clone()
            if completion_only:
                labels[: len(ids) - a] = -100
            else:  # the tutorial's masking: all but padding, <start_of_image> and the image soft tokens
                labels[(ids == self.image_id) | (ids == self.config.boi_token_index) | (ids == PAD_ID)] = -100
            labels[0] = -100
            out.append({
                "input_ids": ids, "labels": labels, "pixel_values": self.images[(first_index + i) % len(self.images)],
                "_index": first_index + i, "_pad_multiple": PAD_TO_MULTIPLE_OF if shape == "varied" else None,
            })
        return out


class Collate:
    """Pads like data.Collator, adds what it adds, and checks that samples arrive in order (the figures rely on it)."""

    def __init__(self, image_token_id: int, with_positions: bool = True):
        import data

        self.image_token_id = image_token_id
        self.expected = 0
        # The LM head's target positions, computed on the host as data.Collator does, for
        # raydrop's loss only: the stock path passes the batch to the model as it is.
        self.label_positions = getattr(data, "label_positions", None) if with_positions else None

    def __call__(self, rows):
        import torch

        index = [r["_index"] for r in rows]
        if index != list(range(self.expected, self.expected + len(rows))):
            raise RuntimeError(f"samples reached the collator out of order ({index[:4]}..., expected "
                               f"{self.expected}...): per-shape figures would be wrong")
        self.expected += len(rows)
        width = padded_width([len(r["input_ids"]) for r in rows], rows[0]["_pad_multiple"])
        n = len(rows)
        input_ids = torch.full((n, width), PAD_ID, dtype=torch.long)
        labels = torch.full((n, width), -100, dtype=torch.long)
        attention_mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(rows):
            k = len(r["input_ids"])
            input_ids[i, :k] = r["input_ids"]
            labels[i, :k] = r["labels"]
            attention_mask[i, :k] = 1
        batch = {
            "input_ids": input_ids, "attention_mask": attention_mask,
            "token_type_ids": (input_ids == self.image_token_id).long(),
            "pixel_values": torch.stack([r["pixel_values"] for r in rows]), "labels": labels,
        }
        if self.label_positions is not None:
            batch["label_positions"], batch["label_targets"] = self.label_positions(labels)
        return batch


def placeholder_tokenizer():
    """A processing class for SFTTrainer (which otherwise loads one); the batches are already token ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>")


# --------------------------------------------------------------------------- trainer


def trl_importable() -> Tuple[bool, str]:
    try:
        import trl  # noqa: F401
        from trl import SFTTrainer  # noqa: F401
    except Exception as e:
        return False, f"TRL not usable here ({type(e).__name__}: {e})"
    return True, ""


def training_namespace(setup: Dict[str, Any], max_steps: int, use_gpu: bool) -> argparse.Namespace:
    """The trainer's flag values (defaults) with the setup's choices and the benchmark's step count."""
    ns = argparse.Namespace(**_parser_defaults())
    for k, v in setup.items():
        if k != "name":
            setattr(ns, k, v)
    ns.max_steps = max_steps
    ns.use_gpu = use_gpu
    ns.logging_steps = 10 ** 9  # no logging inside the timed steps
    ns.save_strategy = "no"
    ns.dataloader_num_workers = 0  # the samples are ready-made tensors
    return ns


def training_arguments(ns: argparse.Namespace, out_dir: str, with_trl: bool):
    """worker.sft_config's arguments: its SFTConfig with TRL, else the same values as TrainingArguments.

    Without TRL, the SFT-only arguments (and any a newer transformers no
    longer has) are dropped and listed.
    """
    import worker

    if with_trl:
        return worker.sft_config(ns, out_dir), []
    kwargs = worker.sft_config_kwargs(ns, out_dir)
    from transformers import TrainingArguments

    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    dropped = sorted(k for k in kwargs if k not in known)
    return TrainingArguments(**{k: v for k, v in kwargs.items() if k in known}), dropped


def raydrop_trainer_without_trl():
    """sft.py's RaydropSFTTrainer (its compute_loss, token counters and log) built on
    transformers' Trainer that applies peft_config as TRL 0.21's SFTTrainer does
    (peft_model_like_trl). Nothing of sft.py is restated."""
    from transformers import Trainer

    import sft

    class SFTLikeTrainer(Trainer):
        def __init__(self, model=None, args=None, peft_config=None, **kwargs):
            if peft_config is not None:
                model = peft_model_like_trl(model, peft_config, args)
            super().__init__(model=model, args=args, **kwargs)

    return sft._make_trainer_class(SFTLikeTrainer)


def tutorial_trainer_without_trl():
    """TRL 0.21's SFTTrainer training path as the tutorial ran it, on transformers' Trainer.

    The loss is transformers' stock one: Trainer.compute_loss calls
    model(**inputs) with the labels, and Gemma 3 computes full-vocabulary
    logits at every position, up-casts them to fp32 and takes a mean
    cross-entropy. On top, what trl==0.21.0's SFTTrainer.compute_loss does
    every micro-batch (trl/trainer/sft_trainer.py): gather the attention-mask
    token count and read it on the host, argmax the full logits for the token
    accuracy, gather both counts and read the accuracy on the host. The
    Trainer decides model_accepts_loss_kwargs itself, as under TRL.
    """
    from transformers import Trainer

    class TutorialSFTTrainer(Trainer):
        def __init__(self, model=None, args=None, peft_config=None, **kwargs):
            if peft_config is not None:
                model = peft_model_like_trl(model, peft_config, args)
            super().__init__(model=model, args=args, **kwargs)
            self._total_train_tokens = 0
            self._token_accuracy: List[float] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            if self.model.training:
                self._total_train_tokens += self.accelerator.gather_for_metrics(
                    inputs["attention_mask"].sum()).sum().item()
            if "labels" in inputs:
                shift_logits = outputs.logits[..., :-1, :].contiguous()
                shift_labels = inputs["labels"][..., 1:].contiguous()
                predictions = shift_logits.argmax(dim=-1)
                mask = shift_labels != -100
                correct = self.accelerator.gather_for_metrics(((predictions == shift_labels) & mask).sum())
                total = self.accelerator.gather_for_metrics(mask.sum())
                total_sum = total.sum()
                self._token_accuracy.append((correct.sum() / total_sum).item() if total_sum > 0 else 0.0)
            return (loss, outputs) if return_outputs else loss

    return TutorialSFTTrainer


def peft_model_like_trl(model, peft_config, training_args):
    """What TRL 0.21's SFTTrainer does with peft_config, for the Trainer without TRL."""
    import torch
    from peft import get_peft_model, prepare_model_for_kbit_training

    gc_kwargs = training_args.gradient_checkpointing_kwargs or {}
    four_bit = getattr(model, "is_loaded_in_4bit", False)
    if four_bit:
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=training_args.gradient_checkpointing,
            gradient_checkpointing_kwargs=gc_kwargs)
    elif training_args.gradient_checkpointing and gc_kwargs.get("use_reentrant", True):
        model.enable_input_require_grads()
    model = get_peft_model(model, peft_config)
    if training_args.bf16 and four_bit:
        # trl.trainer.utils.peft_module_casting_to_bf16
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.LayerNorm) or "norm" in name:
                module.to(torch.float32)
            elif any(x in name for x in ("lm_head", "embed_tokens", "wte", "wpe")):
                if hasattr(module, "weight") and module.weight.dtype == torch.float32:
                    module.to(torch.bfloat16)
    return model


def _in_order(base):
    """base with a sequential sampler: each step's samples are known in advance."""
    from torch.utils.data import SequentialSampler

    class InOrder(base):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    InOrder.__name__ = InOrder.__qualname__ = base.__name__
    InOrder.__module__ = base.__module__
    return InOrder


def _class_label(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --------------------------------------------------------------------------- one setup


class StepTimer:
    """Trainer callback: wall time of every optimizer step, peak memory per shape, LM-head positions, a deadline."""

    def __init__(self, use_gpu: bool, steps_per_shape: int, deadline: float):
        import torch

        self.torch = torch
        self.use_gpu = use_gpu
        self.per_shape = steps_per_shape
        self.deadline = deadline
        self.durations: List[float] = []
        self.peaks: List[Optional[float]] = []
        self.head_positions: List[int] = []  # per step: positions the LM head ran at (forward)
        self.stopped_early = False
        self._t0 = 0.0

    def watch_head(self, trainer) -> None:
        """Counts the positions the output embedding runs at: all of them, or only the loss targets."""
        head = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings()
        if head is None:
            return

        def count(_module, _args, output):
            shape = getattr(output, "shape", None)
            if shape is not None and self.head_positions:
                self.head_positions[-1] += int(math.prod(shape[:-1]))

        head.register_forward_hook(count)

    def _sync(self):
        if self.use_gpu:
            self.torch.cuda.synchronize()

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class _Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer._sync()
                if timer.use_gpu and len(timer.durations) % timer.per_shape == 0:
                    timer.torch.cuda.reset_peak_memory_stats()
                timer.head_positions.append(0)
                timer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                timer._sync()
                timer.durations.append(time.perf_counter() - timer._t0)
                if len(timer.durations) % timer.per_shape == 0:
                    timer.peaks.append(timer.torch.cuda.max_memory_allocated() / 2 ** 30 if timer.use_gpu else None)
                if time.monotonic() > timer.deadline:
                    timer.stopped_early = True
                    control.should_training_stop = True
                return control

        return _Cb()


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


def shape_figures(shape: str, rows: List[Dict[str, Any]], setup: Dict[str, Any], timer: StepTimer, phase: int,
                  args, g: Dict[str, int], peak: Optional[float]) -> Dict[str, Any]:
    """Per-shape throughput, step times, memory, MFU and HFU from the recorded timed steps.

    Model FLOPs: each sample at its unpadded length, the LM head at the
    positions it really ran at (at most the step's tokens). Hardware FLOPs:
    padded widths, the head's positions as run, and checkpoint recompute.
    """
    per_step = setup["per_device_batch_size"] * setup["gradient_accumulation_steps"]
    b = setup["per_device_batch_size"]
    first = phase * (args.warmup + args.steps)
    timed = list(range(first + args.warmup, first + args.warmup + args.steps))
    done = [s for s in timed if s < len(timer.durations)]
    flops_kw = dict(images=1, lora_r=setup["lora_r"], vision_lora=setup["lora_vision_tower"],
                    train_lm_head=setup["train_embeddings"], grad_ckpt=setup["gradient_checkpointing"])

    def fig(t: int, head: Optional[float]) -> Dict[str, float]:
        return flops.flops_per_sample(g, t, head_positions=head, **flops_kw)[0]

    tokens = positions = 0
    head_total: Optional[int] = 0
    model_flops = hardware_flops = 0.0
    for s in done:
        step_rows = rows[s * per_step:(s + 1) * per_step]
        step_tokens = sum(len(r["input_ids"]) for r in step_rows)
        ran = timer.head_positions[s] if s < len(timer.head_positions) and timer.head_positions[s] else None
        if ran is None:
            head_total = None
        elif head_total is not None:
            head_total += ran
        # FLOPs are linear in the head positions: spreading a step's evenly over its samples is exact.
        model_head = None if ran is None else min(ran, step_tokens) / per_step
        hw_head = None if ran is None else ran / per_step
        for m in range(0, per_step, b):
            mb = step_rows[m:m + b]
            lengths = [len(r["input_ids"]) for r in mb]
            width = padded_width(lengths, mb[0]["_pad_multiple"])
            tokens += sum(lengths)
            positions += width * len(mb)
            model_flops += sum(fig(n, model_head)["model_flops"] for n in lengths)
            hardware_flops += fig(width, hw_head)["hardware_flops"] * len(mb)
    steps = [timer.durations[s] for s in done]
    seconds = sum(steps)
    samples = len(done) * per_step
    res: Dict[str, Any] = {
        "shape": shape,
        "timed_steps": len(done), "timed_steps_planned": len(timed), "samples": samples,
        "tokens": tokens, "positions": positions,
        "mean_tokens_per_sample": tokens / samples if samples else None,
        "padding_share": 1 - tokens / positions if positions else None,
        "lm_head_positions": head_total if done else None,
        "seconds": seconds,
        "tokens_per_second_per_gpu": tokens / seconds if seconds else None,
        "samples_per_second": samples / seconds if seconds else None,
        "step_time_mean_s": statistics.fmean(steps) if steps else None,
        "step_time_p50_s": statistics.median(steps) if steps else None,
        "peak_memory_gib": timer.peaks[phase] if phase < len(timer.peaks) else None,
        "model_flops": model_flops, "hardware_flops": hardware_flops,
        "achieved_model_tflops": model_flops / seconds / 1e12 if seconds else None,
        "mfu": model_flops / seconds / peak if seconds and peak else None,
        "hfu": hardware_flops / seconds / peak if seconds and peak else None,
    }
    notes = []
    if len(done) < len(timed):
        notes.append(f"only {len(done)} of {len(timed)} timed steps ran (time limit or error)")
    if done and head_total is None:
        notes.append("LM head positions not observed: counted at every position")
    if notes:
        res["note"] = "; ".join(notes)
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in res.items()}


def build_model_or_fallback(config, setup: Dict[str, Any], use_gpu: bool, args, result: Dict[str, Any]):
    """build_model; a 4-bit setup that cannot quantise here (no bitsandbytes, or none for this CUDA)
    is built in bf16 instead when --4bit-fallback is bf16, and says so (result["fallback"])."""
    try:
        return build_model(config, setup, use_gpu), setup
    except Exception as e:
        if setup["quantization"] != "4bit" or args.four_bit_fallback != "bf16":
            raise
        reason = f"{type(e).__name__}: {e}"[:1000]
    gc.collect()
    if use_gpu:
        import torch

        torch.cuda.empty_cache()
    effective = dict(setup, quantization="none")
    result["fallback"] = (f"bf16 instead of 4-bit NF4 ({reason}). Changes: no dequantisation in the matmuls "
                          "(faster), no fp32 up-cast of the non-quantised weights by "
                          "prepare_model_for_kbit_training, about 3x the weight memory; the FLOPs counted are "
                          "the same. This row is not the tutorial's 4-bit speed.")
    print(f"  FALLBACK: {result['fallback']}", flush=True)
    return build_model(config, effective, use_gpu), effective


def run_setup(setup: Dict[str, Any], args, config, use_gpu: bool, g: Dict[str, int], peak: Optional[float],
              deadline: float, result: Dict[str, Any]) -> None:
    """Builds, trains and measures one setup; fills `result` as it goes (kept when a step fails).

    args here are the setup's own (its shapes, warmup and timed steps).
    """
    import torch

    import modeling

    shapes = list(args.shapes)
    per_step = setup["per_device_batch_size"] * setup["gradient_accumulation_steps"]
    steps_per_shape = args.warmup + args.steps
    max_steps = steps_per_shape * len(shapes)
    raydrop_loss = setup["loss"] == "raydrop"

    t0 = time.perf_counter()
    (model, result["quantization_applied"]), setup = build_model_or_fallback(config, setup, use_gpu, args, result)

    result["total_parameters"] = sum(p.numel() for p in model.parameters())

    maker = SampleMaker(config, args.text_tokens, args.completion_tokens)
    rows: List[Dict[str, Any]] = []
    for shape in shapes:
        rows += maker.rows(shape, steps_per_shape * per_step, setup["completion_only_loss"], len(rows))

    peft_config = modeling.lora_config(
        setup["lora_r"], setup["lora_alpha"], setup["lora_dropout"], setup["lora_target_modules"],
        vision_tower=setup["lora_vision_tower"], train_embeddings=setup["train_embeddings"])
    ns = training_namespace(setup, max_steps, use_gpu)
    out_dir = tempfile.mkdtemp(prefix="raydrop-bench-")
    timer = StepTimer(use_gpu, steps_per_shape, deadline)

    def collate():
        return Collate(config.image_token_index, with_positions=raydrop_loss)

    common = dict(train_dataset=rows, data_collator=collate(), callbacks=[timer.callback()])

    notes: List[str] = []
    trainer = None
    use_trl = args.trainer in ("auto", "trl")
    if use_trl:
        ok, why = trl_importable()
        if not ok:
            if args.trainer == "trl":
                raise RuntimeError(why)
            notes.append(why)
            use_trl = False
    if use_trl:
        import sft

        failure = ""
        try:
            cfg, _ = training_arguments(ns, out_dir, with_trl=True)
            if raydrop_loss:
                cls = _in_order(sft.trainer_class())
            else:
                from trl import SFTTrainer

                cls = _in_order(SFTTrainer)
            trainer = cls(model=model, args=cfg, peft_config=peft_config, processing_class=placeholder_tokenizer(),
                          **common)
            result["trainer_class"] = (f"{_class_label(cls)} on trl.SFTTrainer" if raydrop_loss
                                       else f"{_class_label(cls)} (stock loss)")
        except Exception as e:
            if args.trainer == "trl":
                raise
            failure = f"{type(e).__name__}: {e}"
        if trainer is None:
            # SFTTrainer may have wrapped the model before failing: start again from a fresh one.
            notes.append(f"TRL trainer failed to start ({failure}); model rebuilt, transformers' Trainer used")
            del model
            gc.collect()
            if use_gpu:
                torch.cuda.empty_cache()
            model, result["quantization_applied"] = build_model(config, setup, use_gpu)
            common["data_collator"] = collate()
    if trainer is None:
        cfg, dropped = training_arguments(ns, out_dir, with_trl=False)
        if dropped:
            notes.append("TrainingArguments without " + ", ".join(dropped) + " (SFTConfig-only or unknown here)")
        if raydrop_loss:
            cls = _in_order(raydrop_trainer_without_trl())
            label = "on transformers.Trainer (no TRL; PEFT applied as TRL 0.21's SFTTrainer does)"
        else:
            cls = _in_order(tutorial_trainer_without_trl())
            label = ("on transformers.Trainer: stock loss (model(labels=...), full fp32 logits) and TRL 0.21 "
                     "SFTTrainer's per-micro-batch token count and accuracy; PEFT applied as TRL 0.21 does")
        trainer = cls(model=model, args=cfg, peft_config=peft_config, **common)
        result["trainer_class"] = f"{_class_label(cls)} {label}"
    del model  # the trainer holds it (wrapped)
    timer.watch_head(trainer)
    result["trainer_notes"] = notes
    result["trainable_parameters"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    result["build_seconds"] = time.perf_counter() - t0

    error: Optional[BaseException] = None
    t1 = time.perf_counter()
    try:
        trainer.train()
    except Exception as e:  # keep the shapes already measured, then report the failure
        error = e
    finally:
        result["train_seconds"] = time.perf_counter() - t1
        shutil.rmtree(out_dir, ignore_errors=True)
        for i, shape in enumerate(shapes):
            result["shapes"][shape] = shape_figures(shape, rows, setup, timer, i, args, g, peak)
        if timer.stopped_early:
            result["trainer_notes"].append("stopped at the time limit (--time-limit)")
    if error is not None:
        raise error


def setup_args(setup: Dict[str, Any], args):
    """The run's arguments with this setup's shapes and step counts (the ablations' are shorter)."""
    sargs = copy.copy(args)
    if setup["name"].startswith("tutorial+"):
        sargs.shapes = [s for s in args.ablation_shapes]
        sargs.warmup, sargs.steps = args.ablation_warmup, args.ablation_steps
    return sargs


def run_setup_safely(setup, args, config, use_gpu, g, peak, deadline) -> Dict[str, Any]:
    sargs = setup_args(setup, args)
    result: Dict[str, Any] = {"name": setup["name"], "status": "ok", "error": None, "config": dict(setup),
                              "fallback": None, "steps": {"warmup_per_shape": sargs.warmup,
                                                          "timed_per_shape": sargs.steps},
                              "trainer_class": None, "trainer_notes": [], "shapes": {}}
    if time.monotonic() > deadline:
        result.update(status="skipped", error="not started: the time limit (--time-limit) was reached")
        return result
    t0 = time.perf_counter()
    try:
        run_setup(setup, sargs, config, use_gpu, g, peak, deadline, result)
    except Exception as e:  # includes torch.cuda.OutOfMemoryError: record it and go on
        result["status"] = "failed"
        result["error"] = f"{type(e).__name__}: {e}"[:4000]
        result["traceback"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]
    finally:
        gc.collect()
        if use_gpu:
            import torch

            torch.cuda.empty_cache()
            result["memory_left_gib"] = torch.cuda.memory_allocated() / 2 ** 30  # after freeing the setup
        result["seconds"] = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------- output


def _fmt(v: Optional[float], spec: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, spec)


NAME_WIDTH = 22
TABLE_HEAD = (f"{'setup':<{NAME_WIDTH}} {'shape':<7} {'tokens/s/GPU':>13} {'samples/s':>10} {'step mean':>10} "
              f"{'step p50':>9} {'peak GiB':>9} {'MFU %':>7} {'HFU %':>7}")

MFU_CONVENTION = (
    "MFU = model FLOPs of the timed steps / their time / the GPU's dense BF16 peak (H200 SXM: 989.4 TFLOP/s, "
    "half NVIDIA's with-sparsity figure). Model FLOPs as bench/flops.py counts them: 2N per token forward "
    "for every matmul, 2N backward for activation gradients, +2N only for trainable weights, attention "
    "4 T^2 width forward and twice that backward, the vision tower included (4,096 patches per image), "
    "the LM head at the positions it really ran at, each sample at its unpadded length. HFU adds padding "
    "and gradient-checkpointing recompute. 4-bit dequantisation is not counted.")


def setup_rows(name: str, r: Dict[str, Any]) -> List[str]:
    lines = []
    for shape, s in r["shapes"].items():
        lines.append(f"{name:<{NAME_WIDTH}} {shape:<7} {_fmt(s['tokens_per_second_per_gpu'], '13,.0f')} "
                     f"{_fmt(s['samples_per_second'], '10.3f')} {_fmt(s['step_time_mean_s'], '9.3f')}s "
                     f"{_fmt(s['step_time_p50_s'], '8.3f')}s {_fmt(s['peak_memory_gib'], '9.1f')} "
                     f"{_fmt(s['mfu'], '7.2f', 100)} {_fmt(s['hfu'], '7.2f', 100)}")
    if r["status"] != "ok":
        lines.append(f"{name:<{NAME_WIDTH}} {r['status'].upper()}: {r['error']}")
    if r.get("fallback"):
        lines.append(f"{name:<{NAME_WIDTH}} FALLBACK: {r['fallback']}")
    return lines


def table_lines(report: Dict[str, Any]) -> List[str]:
    lines = [TABLE_HEAD, "-" * len(TABLE_HEAD)]
    for name, r in report["setups"].items():
        lines += setup_rows(name, r)
    tut = report["setups"].get("tutorial") or {}
    label = " (tutorial in bf16: fallback, not 4-bit)" if tut.get("fallback") else ""
    for shape, ratio in report["ratios"].items():
        lines.append(f"raydrop / tutorial tokens/s, {shape} shape = {_fmt(ratio, '.1f')}x (target >= 20x){label}")
    for name, r in report["setups"].items():
        lines.append(f"{name}: {r['trainer_class'] or 'no trainer'}"
                     + "".join(f"\n  note: {n}" for n in r["trainer_notes"]))
    v = report["versions"]
    lines.append("versions: " + ", ".join(f"{k} {v.get(k)}" for k in (
        "python", "torch", "cuda", "transformers", "tokenizers", "huggingface_hub", "peft", "accelerate", "trl",
        "bitsandbytes")))
    lines.append(f"stack: {v.get('stack')}")
    lines.append(f"device: {report['device']['name']}; peak: {report['device']['peak_source']}")
    lines.append(MFU_CONVENTION)
    if report.get("wall_seconds") is not None:
        lines.append(f"wall time {report['wall_seconds']:.0f} s")
    if report["dry_run"]:
        lines.append("[dry run: tiny model on CPU, the figures mean nothing]")
    return lines


def print_table(report: Dict[str, Any]) -> None:
    print("\n" + "\n".join(table_lines(report)), flush=True)


def write_table(path: str, report: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(table_lines(report)) + "\n")
    os.replace(tmp, path)


def write_json(path: str, report: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def print_arithmetic(g: Dict[str, int], setup: Dict[str, Any], positions: int, title: str,
                     head_positions: Optional[float] = None) -> None:
    _, lines = flops.flops_per_sample(g, positions, 1, setup["lora_r"], vision_lora=setup["lora_vision_tower"],
                                      train_lm_head=setup["train_embeddings"],
                                      grad_ckpt=setup["gradient_checkpointing"], head_positions=head_positions)
    print(title)
    for line in lines:
        print("  " + line)


# --------------------------------------------------------------------------- main


def ratios(report: Dict[str, Any], shapes: Sequence[str]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    for shape in shapes:
        try:
            a = report["setups"]["raydrop"]["shapes"][shape]["tokens_per_second_per_gpu"]
            b = report["setups"]["tutorial"]["shapes"][shape]["tokens_per_second_per_gpu"]
            out[shape] = a / b if a and b else None
        except KeyError:
            out[shape] = None
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="tiny model on CPU: 1 warmup + 2 timed steps per shape, 1 timed step per tutorial+<change>")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per shape and setup")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps before each shape's timed ones")
    p.add_argument("--setups", default="raydrop,tutorial,ablations",
                   help="comma-separated, run in this order: raydrop, tutorial, tutorial+<change>, or ablations "
                        "(every tutorial+<change>: the tutorial with one of raydrop's changes)")
    p.add_argument("--ablation-shapes", default="fixed", help="shapes of the tutorial+<change> rows")
    p.add_argument("--ablation-steps", type=int, default=5, help="timed optimizer steps of a tutorial+<change> row")
    p.add_argument("--ablation-warmup", type=int, default=2, help="warmup steps of a tutorial+<change> row")
    p.add_argument("--4bit-fallback", dest="four_bit_fallback", choices=("bf16", "fail"), default="bf16",
                   help="bf16: a 4-bit setup that cannot quantise here runs in bf16, labelled as a fallback")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: fixed, varied")
    p.add_argument("--trainer", choices=("auto", "trl", "transformers"), default="auto",
                   help="auto: RaydropSFTTrainer when TRL works, else transformers' Trainer with the same loss")
    p.add_argument("--text-tokens", type=int, default=152, help="text tokens per fixed sample, bos included")
    p.add_argument("--completion-tokens", type=int, default=60, help="answer tokens per fixed sample")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense BF16 peak; default: by GPU name")
    p.add_argument("--time-limit", type=float, default=390.0,
                   help="seconds: stop training (and skip setups not started) past this; figures keep the steps run")
    p.add_argument("--out", default="", help=f"folder for {RESULT_FILE} (default: the current folder)")
    p.add_argument("--json", default="", help=f"result path (default: <--out>/{RESULT_FILE})")
    p.add_argument("--table", default="", help=f"table path (default: beside the JSON, {TABLE_FILE})")
    args = p.parse_args(argv)
    start = time.monotonic()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import torch

    if args.dry_run:
        args.steps, args.warmup, args.text_tokens, args.completion_tokens = 2, 1, 40, 10
        args.ablation_steps, args.ablation_warmup = 1, 0
    for flag in ("shapes", "ablation_shapes"):
        shapes = [s.strip() for s in getattr(args, flag).split(",") if s.strip()]
        bad = [s for s in shapes if s not in SHAPES]
        if bad or not shapes:
            p.error(f"--{flag.replace('_', '-')}: unknown {bad}; known {list(SHAPES)}")
        setattr(args, flag, shapes)
    known = all_setups()
    names: List[str] = []
    for n in (s.strip() for s in args.setups.split(",") if s.strip()):
        names += [k for k in known if k.startswith("tutorial+")] if n == "ablations" else [n]
    if not names or any(n not in known for n in names):
        p.error(f"--setups: expected names from {list(known) + ['ablations']}, got {args.setups!r}")
    if args.steps < 1 or args.warmup < 0 or args.ablation_steps < 1 or args.ablation_warmup < 0:
        p.error("--steps and --ablation-steps must be >= 1, --warmup and --ablation-warmup >= 0")
    json_path = args.json or os.path.join(args.out or ".", RESULT_FILE)
    table_path = args.table or os.path.join(os.path.dirname(os.path.abspath(json_path)), TABLE_FILE)

    use_gpu = torch.cuda.is_available() and not args.dry_run
    if use_gpu:
        torch.backends.cuda.matmul.allow_tf32 = True  # as worker.train_func
    gpu = torch.cuda.get_device_name(0) if use_gpu else "cpu"
    peak, peak_source = peak_flops(gpu, args.peak_tflops, args.dry_run)
    spec = TINY if args.dry_run else GEMMA3_4B
    fixed_positions = args.text_tokens + spec["mm_tokens_per_image"] + 4  # \n\n boi image*N eoi \n\n
    report: Dict[str, Any] = {
        "benchmark": "raydrop trainer: optimizer-step throughput and MFU on one GPU (bench/bench.py)",
        "dry_run": bool(args.dry_run),
        "device": {"name": gpu, "peak_bf16_dense_tflops": peak / 1e12 if peak else None, "peak_source": peak_source},
        "versions": library_versions(),
        "model": ("tiny Gemma 3 (dry run)" if args.dry_run
                  else "Gemma 3 4B (google/gemma-3-4b-it config), random weights"),
        "steps": {"warmup_per_shape": args.warmup, "timed_per_shape": args.steps,
                  "ablations": {"warmup_per_shape": args.ablation_warmup, "timed_per_shape": args.ablation_steps,
                                "shapes": args.ablation_shapes}},
        "mfu_convention": MFU_CONVENTION,
        "shapes": {
            "fixed": (f"{args.text_tokens} text tokens (bos included) + one image block = {fixed_positions} "
                      f"positions, no padding"),
            "varied": (f"prompt text ~ normal(mean {args.text_tokens - args.completion_tokens - 1}, "
                       f"sd {PROMPT_REL_SD:.0%}), answer ~ log-normal(mean {args.completion_tokens}, cv {ANSWER_CV}), "
                       f"seed {VARIED_SEED}, one image block; padded to the batch max and a multiple of "
                       f"{PAD_TO_MULTIPLE_OF}; answer-only labels in the raydrop setup"),
        },
        "setups": {}, "ratios": {}, "error": None,
    }
    if not use_gpu and not args.dry_run:
        report["error"] = "no CUDA GPU: run with --dry-run for the CPU check"
        write_json(json_path, report)
        print(report["error"], file=sys.stderr)
        return 2

    config = build_config(spec)
    g = flops.dims(config)
    report["model_dims"] = g
    print(f"device: {gpu}; dense BF16 peak: {peak_source}", flush=True)
    deadline = start + args.time_limit

    for name in names:
        setup = known[name]
        print(f"\n== {name}: " + ", ".join(f"{k}={v}" for k, v in setup.items() if k != "name"), flush=True)
        res = run_setup_safely(setup, args, config, use_gpu, g, peak, deadline)
        report["setups"][name] = res
        fixed = res["shapes"].get("fixed") or {}
        if res["status"] == "ok" and fixed.get("samples"):
            head = fixed["lm_head_positions"] / fixed["samples"] if fixed.get("lm_head_positions") else None
            print_arithmetic(g, setup, fixed_positions, f"  model FLOPs per fixed sample ({name}):", head)
        elif res["status"] != "ok":
            print(f"  {res['status'].upper()}: {res['error']}", flush=True)
        # The setup's figures now, so that a run killed later still shows them.
        print(f"  {name}: built in {_fmt(res.get('build_seconds'), '.1f')} s, trained in "
              f"{_fmt(res.get('train_seconds'), '.1f')} s, {res['seconds']:.1f} s in all; at "
              f"{time.monotonic() - start:.0f} s of the run", flush=True)
        print("  " + TABLE_HEAD + "\n" + "\n".join("  " + line for line in setup_rows(name, res)), flush=True)
        report["versions"] = library_versions()
        report["ratios"] = ratios(report, args.shapes)
        report["wall_seconds"] = time.monotonic() - start
        write_json(json_path, report)  # after every setup: a killed run still leaves its figures
        write_table(table_path, report)

    report["ratios"] = ratios(report, args.shapes)
    report["wall_seconds"] = time.monotonic() - start
    write_json(json_path, report)
    write_table(table_path, report)
    print_table(report)
    print(f"result: {os.path.abspath(json_path)}\ntable: {os.path.abspath(table_path)}")

    if args.dry_run:
        g4 = flops.dims(build_config(GEMMA3_4B))
        for make in (raydrop_setup, tutorial_setup):
            s = make()
            print_arithmetic(g4, s, 412,
                             f"\nGemma 3 4B arithmetic, {s['name']} setup, 412 positions + one 896x896 image:")
    return 0


if __name__ == "__main__":
    sys.exit(main())
