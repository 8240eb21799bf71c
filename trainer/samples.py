"""Sample answers: after training, rank 0 answers a few held-out rows with the
tuned adapter and, with the adapter switched off, with the base model, so a
person can compare them with the reference answer.

Written beside the completion mark: <experiment>/samples/samples.json and one
PNG per row's image (sample-NN.png). Greedy decoding, at most MAX_NEW_TOKENS
new tokens per answer.
"""

from __future__ import annotations

import io
import json
import posixpath
import time
from typing import Any, Dict, List

import data
import result

MAX_NEW_TOKENS = 256


def answer(model, processor, row: Dict[str, Any], max_new_tokens: int) -> str:
    """The model's greedy answer to the row's prompt (image included)."""
    import torch

    prompt_ids, _ = data.encode_text(processor, row)
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    pixels = processor.image_processor([row[data.IMAGE_COLUMN].convert("RGB")], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=(ids == image_id).long(),
            pixel_values=pixels.to(device=device, dtype=dtype), max_new_tokens=max_new_tokens,
            do_sample=False, use_cache=True,
        )
    return processor.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def write(model, processor, rows, storage_path: str, experiment: str,
          max_new_tokens: int = MAX_NEW_TOKENS) -> Dict[str, Any]:
    """Answer rows with the tuned model (a PeftModel) and the base model; write
    samples.json and the images; return the document written."""
    start = time.time()
    storage_path = result.normalize_storage_path(storage_path)
    fs, base = result.filesystem(storage_path)
    folder = posixpath.join(base, experiment, result.SAMPLES_DIR)
    fs.create_dir(folder, recursive=True)
    was_training = model.training
    model.eval()
    items: List[Dict[str, Any]] = []
    for i, row in enumerate(rows):
        tuned = answer(model, processor, row, max_new_tokens)
        with model.disable_adapter():
            base_answer = answer(model, processor, row, max_new_tokens)
        image = f"sample-{i:02d}.png"
        buf = io.BytesIO()
        row[data.IMAGE_COLUMN].convert("RGB").save(buf, format="PNG")
        _put(fs, posixpath.join(folder, image), buf.getvalue())
        prompt, _ = data.prompt_and_completion(processor, row)
        items.append({
            "productName": row["Product Name"], "category": row["Category"], "prompt": prompt,
            "image": image, "reference": row["description"], "base": base_answer, "tuned": tuned,
        })
    model.train(was_training)
    doc = {"schemaVersion": 1, "count": len(items), "maxNewTokens": max_new_tokens,
           "seconds": round(time.time() - start, 3), "samples": items}
    _put(fs, posixpath.join(folder, result.SAMPLES_FILE), (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    return doc


def _put(fs, path: str, payload: bytes) -> None:
    with fs.open_output_stream(path) as f:
        f.write(payload)
