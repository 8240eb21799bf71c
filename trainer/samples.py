"""Sample answers: after training, rank 0 answers a few held-out rows with the
tuned adapter and, with the adapter switched off, with the base model, so a
person can compare them with the reference answer.

Written beside the completion mark: <experiment>/samples/samples.json and one
PNG per image (sample-NN-M.png). Each row shows the prompt (the conversation up
to the last answer, as the model saw it), its images, the reference answer
(the row's last assistant turn) and both models' answers; the document also
scores both against the references: exact match and a token-overlap F1 (words
compared case-insensitively, as SQuAD scores answers). All rows are answered in
one left-padded batch per adapter state: two generate calls in all. Greedy
decoding, at most MAX_NEW_TOKENS new tokens per answer.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import time
from collections import Counter
from typing import Any, Dict, List, Sequence

import data
import result

MAX_NEW_TOKENS = 256
WORD_RE = re.compile(r"\w+", re.UNICODE)


def _prompt_ids(processor, row: Dict[str, Any], fmt: data.Format) -> List[int]:
    prompt, _ = data.prompt_and_completion(processor, row, fmt)
    return data._tokens(processor, prompt, expand_images=True)


def answer_all(model, processor, rows: Sequence[Dict[str, Any]], fmt: data.Format,
               max_new_tokens: int) -> List[str]:
    """The model's greedy answers to the rows' prompts, images included, in one batch."""
    import torch

    tok = processor.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts = [_prompt_ids(processor, row, fmt) for row in rows]
    width = max(len(p) for p in prompts)
    device = next(model.parameters()).device
    # Left padding: every prompt ends where generation starts.
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    image_id = tok.convert_tokens_to_ids(processor.image_token)
    images = [data.open_image(r).convert("RGB") for row in rows for r in data.row_images(row, fmt)]
    kwargs: Dict[str, Any] = {}
    if images:
        dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        pixels = processor.image_processor(images, return_tensors="pt")["pixel_values"]
        kwargs["pixel_values"] = pixels.to(device=device, dtype=dtype)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, token_type_ids=(ids == image_id).long(),
            max_new_tokens=max_new_tokens, do_sample=False, use_cache=True, pad_token_id=pad, **kwargs,
        )
    return [tok.decode(o[width:], skip_special_tokens=True).strip() for o in out]


def token_f1(answer: str, reference: str) -> float:
    """Harmonic mean of word precision and recall against the reference."""
    a = [w.lower() for w in WORD_RE.findall(answer)]
    r = [w.lower() for w in WORD_RE.findall(reference)]
    if not a and not r:
        return 1.0
    common = sum((Counter(a) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall)


def scores(answers: Sequence[str], references: Sequence[str]) -> Dict[str, float]:
    n = len(answers)
    if n == 0:
        return {"exactMatch": 0.0, "tokenF1": 0.0}
    exact = sum(1 for a, r in zip(answers, references) if a.strip() == r.strip())
    return {"exactMatch": round(exact / n, 4),
            "tokenF1": round(sum(token_f1(a, r) for a, r in zip(answers, references)) / n, 4)}


def reference(processor, row: Dict[str, Any], fmt: data.Format) -> str:
    """The row's last assistant answer, as text."""
    msgs = data.conversation(row, fmt)
    for m in reversed(msgs):
        if m["role"] == "assistant":
            return "".join(p.get("text", "") for p in m["content"] if p["type"] == "text").strip()
    return ""


def write(model, processor, rows, storage_path: str, experiment: str,
          max_new_tokens: int = MAX_NEW_TOKENS, fmt: data.Format = data.TUTORIAL) -> Dict[str, Any]:
    """Answer rows with the tuned model (a PeftModel) and the base model; write
    samples.json and the images; return the document written."""
    start = time.time()
    storage_path = result.normalize_storage_path(storage_path)
    fs, base = result.filesystem(storage_path)
    folder = posixpath.join(base, experiment, result.SAMPLES_DIR)
    fs.create_dir(folder, recursive=True)
    rows = list(rows)
    was_training = model.training
    model.eval()
    tuned = answer_all(model, processor, rows, fmt, max_new_tokens) if rows else []
    with model.disable_adapter():
        base_answers = answer_all(model, processor, rows, fmt, max_new_tokens) if rows else []
    model.train(was_training)
    generate_seconds = time.time() - start
    items: List[Dict[str, Any]] = []
    refs = []
    for i, row in enumerate(rows):
        names = []
        for j, ref in enumerate(data.row_images(row, fmt)):
            name = f"sample-{i:02d}-{j}.png"
            buf = io.BytesIO()
            data.open_image(ref).convert("RGB").save(buf, format="PNG")
            _put(fs, posixpath.join(folder, name), buf.getvalue())
            names.append(name)
        prompt, _ = data.prompt_and_completion(processor, row, fmt)
        want = reference(processor, row, fmt)
        refs.append(want)
        items.append({"prompt": prompt, "images": names, "reference": want, "base": base_answers[i],
                      "tuned": tuned[i]})
    doc = {"schemaVersion": 2, "count": len(items), "maxNewTokens": max_new_tokens,
           "seconds": round(time.time() - start, 3), "generateSeconds": round(generate_seconds, 3),
           "scores": {"base": scores(base_answers, refs), "tuned": scores(tuned, refs)},
           "samples": items}
    _put(fs, posixpath.join(folder, result.SAMPLES_FILE), (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    return doc


def _put(fs, path: str, payload: bytes) -> None:
    with fs.open_output_stream(path) as f:
        f.write(payload)
