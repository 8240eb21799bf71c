"""Dataset loading, prompt construction and the batch collator.

Rows carry the product-description dataset's columns: "Product Name",
"Category", "image" (a PIL image) and "description". The dataset stays an
Arrow table: images are decoded only when the sampler hands a row to this
worker's collator, so each worker decodes only its own shard.

Every sample is encoded as prompt tokens followed by completion tokens, and
the length filter uses the very same encoding, so --max-seq-length is exact.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

IGNORE_INDEX = -100

SYSTEM_MESSAGE = "You are an expert product description writer for Amazon."

USER_PROMPT = """Create a Short Product description based on the provided <PRODUCT> and <CATEGORY> and image.
Only return description. The description should be SEO optimized and for a better mobile search experience.

<PRODUCT>
{product}
</PRODUCT>

<CATEGORY>
{category}
</CATEGORY>
"""

TEXT_COLUMNS = ("Product Name", "Category", "description")
IMAGE_COLUMN = "image"


def load_rows(dataset_id: str, split: str):
    """Load a split from the Hub or from a local path, without decoding images."""
    import datasets

    if os.path.isdir(dataset_id) and (
        os.path.exists(os.path.join(dataset_id, "dataset_info.json"))
        or os.path.exists(os.path.join(dataset_id, "dataset_dict.json"))
    ):
        ds = datasets.load_from_disk(dataset_id)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(dataset_id, split=split)
    missing = [c for c in TEXT_COLUMNS + (IMAGE_COLUMN,) if c not in ds.column_names]
    if missing:
        raise ValueError(f"dataset {dataset_id!r} lacks columns {missing}; has {ds.column_names}")
    return ds


def hold_out(dataset, share: float, seed: int):
    """(train, eval): share of the rows (at least one, and at least one left
    to train on) drawn with seed; eval is None when share is 0."""
    if share <= 0:
        return dataset, None
    n = len(dataset)
    if n < 2:
        raise ValueError(f"cannot hold out rows for evaluation from a dataset of {n} row(s); set dataset.evalShare to 0")
    size = min(max(1, round(n * share)), n - 1)
    parts = dataset.train_test_split(test_size=size, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def messages(row: Dict[str, Any], with_answer: bool = True) -> List[Dict[str, Any]]:
    """The conversation for one row, in the chat-template message format."""
    user_text = USER_PROMPT.format(product=row["Product Name"], category=row["Category"])
    msgs: List[Dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_MESSAGE}]},
        {"role": "user", "content": [{"type": "text", "text": user_text}, {"type": "image"}]},
    ]
    if with_answer:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": row["description"]}]})
    return msgs


def prompt_and_completion(processor, row: Dict[str, Any]) -> Tuple[str, str]:
    """Split the rendered conversation at the start of the assistant's answer."""
    prompt = processor.apply_chat_template(messages(row, with_answer=False), add_generation_prompt=True, tokenize=False)
    full = processor.apply_chat_template(messages(row, with_answer=True), add_generation_prompt=False, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("chat template does not render the prompt as a prefix of the conversation")
    return prompt, full[len(prompt):]


def encode_text(processor, row: Dict[str, Any]) -> Tuple[List[int], List[int]]:
    """Token ids of the prompt (image placeholder expanded) and of the completion.

    The image placeholder is expanded exactly as the Gemma 3 processor does it
    (boi token -> "\\n\\n<boi><image>*N<eoi>\\n\\n"). The chat template already
    starts with <bos>, so the tokenizer adds no special tokens of its own.
    """
    tok = processor.tokenizer
    prompt, completion = prompt_and_completion(processor, row)
    prompt = prompt.replace(processor.boi_token, processor.full_image_sequence)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tok(completion, add_special_tokens=False)["input_ids"]
    return prompt_ids, completion_ids


def sequence_lengths(processor, dataset) -> List[int]:
    """Exact token count of every row (no image is decoded)."""
    text_only = dataset.select_columns(list(TEXT_COLUMNS))
    lengths = []
    for row in text_only:
        p, c = encode_text(processor, row)
        lengths.append(len(p) + len(c))
    return lengths


def filter_by_length(dataset, processor, max_length: int):
    """Leave out rows longer than max_length.

    Truncating a vision-language sample could cut through the image's token
    block (the model then fails on a token/feature count mismatch) or drop the
    whole answer, so over-long rows are skipped instead, and counted.
    Returns (dataset, number of rows left out, the longest row's length).
    """
    lengths = sequence_lengths(processor, dataset)
    keep = [i for i, n in enumerate(lengths) if n <= max_length]
    longest = max(lengths) if lengths else 0
    if not keep:
        raise ValueError(
            f"every row is longer than --max-seq-length {max_length} (shortest {min(lengths) if lengths else 0})"
        )
    dropped = len(lengths) - len(keep)
    if dropped:
        dataset = dataset.select(keep)
    return dataset, dropped, longest


def label_positions(labels):
    """The positions whose next token is a target, as flat indices into the
    (batch * seq) hidden states, and those targets: the LM head runs there
    only. Computed on the host by the collator, so no boolean mask is
    resolved on the device."""
    shift = labels[:, 1:]
    rows, cols = (shift != IGNORE_INDEX).nonzero(as_tuple=True)
    return rows * labels.shape[1] + cols, shift[rows, cols]


class Collator:
    """Turns rows into a Gemma 3 training batch.

    completion_only=True: labels are the assistant's answer (and its end-of-turn
    marker) only. False: every token but padding, <start_of_image> and the
    image soft tokens, as in the reference tutorial.
    """

    def __init__(self, processor, completion_only: bool = True, pad_to_multiple_of: Optional[int] = None):
        tok = processor.tokenizer
        self.processor = processor
        self.completion_only = completion_only
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.image_token_id = tok.convert_tokens_to_ids(processor.image_token)
        self.boi_token_id = tok.convert_tokens_to_ids(processor.boi_token)
        self.image_seq_length = processor.image_seq_length

    def __call__(self, rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        import torch

        ids_list, labels_list, images = [], [], []
        for row in rows:
            prompt_ids, completion_ids = encode_text(self.processor, row)
            ids = prompt_ids + completion_ids
            if self.completion_only:
                labels = [IGNORE_INDEX] * len(prompt_ids) + list(completion_ids)
            else:
                labels = [
                    IGNORE_INDEX if t in (self.pad_id, self.boi_token_id, self.image_token_id) else t for t in ids
                ]
            # Position 0 is never a target after the shift; masking it keeps the
            # Trainer's count of loss tokens equal to the tokens really scored.
            labels[0] = IGNORE_INDEX
            n_img = sum(1 for t in ids if t == self.image_token_id)
            if n_img != self.image_seq_length:
                raise ValueError(f"sample has {n_img} image tokens, expected {self.image_seq_length}")
            ids_list.append(ids)
            labels_list.append(labels)
            images.append(row[IMAGE_COLUMN].convert("RGB"))

        width = max(len(x) for x in ids_list)
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            width = (width + m - 1) // m * m
        n = len(ids_list)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((n, width), dtype=torch.long)
        for i, (ids, lab) in enumerate(zip(ids_list, labels_list)):
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            labels[i, : len(lab)] = torch.tensor(lab, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        token_type_ids = (input_ids == self.image_token_id).long()
        pixel_values = self.processor.image_processor(images, return_tensors="pt")["pixel_values"]
        positions, targets = label_positions(labels)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "pixel_values": pixel_values,
            "labels": labels,
            "label_positions": positions,
            "label_targets": targets,
        }
