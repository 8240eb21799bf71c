"""A tiny Gemma 3 (random weights) with an offline processor, and a toy dataset.

The processor mirrors the real one's structure: a tokenizer carrying the
boi/eoi/image special tokens, Gemma 3's image processor and a chat template
rendering turns as Gemma 3 does. The tokenizer is character level so any text
encodes without a trained vocabulary.
"""

from __future__ import annotations

import os
from typing import Dict, List

SPECIALS = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_image>", "<end_of_image>", "<image_soft_token>",
]
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
BOI_ID, EOI_ID, IMAGE_ID = 6, 7, 8
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
VOCAB_SIZE = 128  # >= len(SPECIALS) + len(CHARS) = 105
IMAGE_SIZE = 32
MM_TOKENS = 4

# Gemma 3's chat template, reduced to what the trainer's messages use.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def build_processor():
    from tokenizers import Tokenizer, models
    from transformers import Gemma3ImageProcessor, Gemma3Processor, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        extra_special_tokens={
            "image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
        },
    )
    image_processor = Gemma3ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return Gemma3Processor(
        image_processor=image_processor, tokenizer=fast, chat_template=CHAT_TEMPLATE, image_seq_length=MM_TOKENS,
    )


def gemma3_processor(tokenizer_dir: str):
    """A Gemma3Processor with Gemma 3's real tokenizer and chat template (the
    folder holds tokenizer.json and tokenizer_config.json) and
    google/gemma-3-4b-it's image settings: 896 x 896, mean and std 0.5, 256
    soft tokens per image."""
    import json

    from transformers import Gemma3ImageProcessor, Gemma3Processor, GemmaTokenizerFast

    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    keep = ("bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token", "add_eos_token",
            "extra_special_tokens")
    tok = GemmaTokenizerFast(tokenizer_file=os.path.join(tokenizer_dir, "tokenizer.json"),
                             **{k: v for k, v in cfg.items() if k in keep})
    images = Gemma3ImageProcessor(size={"height": 896, "width": 896}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Gemma3Processor(image_processor=images, tokenizer=tok, chat_template=cfg["chat_template"],
                           image_seq_length=256)


def build_config():
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=64, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=1024, rope_scaling=None,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
    )
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=IMAGE_SIZE, patch_size=8, vision_use_head=False,
    )
    return Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=MM_TOKENS,
        boi_token_index=BOI_ID, eoi_token_index=EOI_ID, image_token_index=IMAGE_ID,
    )


def save_model(path: str, seed: int = 0) -> str:
    import torch
    from transformers import Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(build_config())
    model.save_pretrained(path)
    build_processor().save_pretrained(path)
    return path


CATEGORIES = {
    # category: (image colour, the description the model should learn)
    "Toys": ((220, 40, 40), "A red toy for fun."),
    "Books": ((40, 40, 220), "A blue book to read."),
    "Tools": ((40, 200, 40), "A green tool for work."),
    "Garden": ((230, 200, 30), "A yellow pot to grow."),
}


def rows(n: int = 16, long_rows: int = 1) -> List[Dict]:
    from PIL import Image

    out = []
    names = list(CATEGORIES)
    for i in range(n):
        cat = names[i % len(names)]
        colour, desc = CATEGORIES[cat]
        out.append({
            "Product Name": f"{cat[:-1]} {i}",
            "Category": cat,
            "image": Image.new("RGB", (48, 40), colour),
            "description": desc,
        })
    for j in range(long_rows):
        out.append({
            "Product Name": f"Long {j}",
            "Category": "Toys",
            "image": Image.new("RGB", (48, 40), (0, 0, 0)),
            "description": "far too long " * 60,
        })
    return out


def save_dataset(path: str, n: int = 16, long_rows: int = 1) -> str:
    import datasets

    data = rows(n, long_rows)
    features = datasets.Features({
        "Product Name": datasets.Value("string"),
        "Category": datasets.Value("string"),
        "image": datasets.Image(),
        "description": datasets.Value("string"),
    })
    ds = datasets.Dataset.from_list(data, features=features)
    datasets.DatasetDict({"train": ds}).save_to_disk(path)
    return path


COLOURS = {"red": (220, 40, 40), "blue": (40, 40, 220), "green": (40, 200, 40), "yellow": (230, 200, 30)}


def png(colour, size=(40, 32)) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, COLOURS[colour]).save(buf, format="PNG")
    return buf.getvalue()


def write_imagefolder(folder: str, n: int = 12, metadata: str = "metadata.jsonl", extra=None) -> str:
    """An ImageFolder dataset in the user's own columns: images/NN.png beside
    metadata.jsonl (or .csv) with file_name, question, colour."""
    import csv
    import json

    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    names = list(COLOURS)
    recs = []
    for i in range(n):
        colour = names[i % len(names)]
        with open(os.path.join(folder, "images", f"{i:02d}.png"), "wb") as f:
            f.write(png(colour))
        recs.append({"file_name": f"images/{i:02d}.png", "question": "What colour is the square?",
                     "colour": colour, **(extra(i) if extra else {})})
    path = os.path.join(folder, metadata)
    with open(path, "w", encoding="utf-8", newline="") as f:
        if metadata.endswith(".csv"):
            w = csv.DictWriter(f, fieldnames=list(recs[0]))
            w.writeheader()
            w.writerows(recs)
        else:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    return folder


def messages_rows(n: int = 12):
    """Conversations with 0, 1 and 2 images (cycling), several turns in some:
    [(messages, [colour, ...])]."""
    names = list(COLOURS)
    out = []
    for i in range(n):
        k = i % 3
        colours = [names[(i + j) % len(names)] for j in range(k)]
        content = [{"type": "image"} for _ in colours] + [{"type": "text", "text": f"How many squares? ({i})"}]
        msgs = [{"role": "user", "content": content},
                {"role": "assistant", "content": [{"type": "text", "text": f"{k}."}]}]
        if colours:
            msgs += [{"role": "user", "content": "And the first colour?"},
                     {"role": "assistant", "content": colours[0] + "."}]
        out.append((msgs, colours))
    return out


def write_messages_jsonl(folder: str, n: int = 12, embed=False) -> str:
    """messages.jsonl: the TRL conversational format, images as relative paths
    (or data: URIs when embed)."""
    import base64
    import json

    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    with open(os.path.join(folder, "train.jsonl"), "w", encoding="utf-8") as f:
        for i, (msgs, colours) in enumerate(messages_rows(n)):
            images = []
            for j, c in enumerate(colours):
                if embed:
                    images.append("data:image/png;base64," + base64.b64encode(png(c)).decode())
                else:
                    name = f"img/{i:02d}-{j}.png"
                    with open(os.path.join(folder, name), "wb") as g:
                        g.write(png(c))
                    images.append(name)
            f.write(json.dumps({"messages": msgs, "images": images}) + "\n")
    return folder


if __name__ == "__main__":  # build both into a folder, for poking at by hand
    import sys

    root = sys.argv[1]
    save_model(os.path.join(root, "model"))
    save_dataset(os.path.join(root, "dataset"))
    print(root)
