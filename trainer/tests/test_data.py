"""Prompt construction, length filtering and label masking."""

from __future__ import annotations

import data
import tiny


def _decode(processor, ids):
    return "".join(processor.tokenizer.convert_ids_to_tokens(ids))


def test_completion_only_labels_are_the_answer(processor, dataset):
    rows = [dataset[0], dataset[1], dataset[2]]  # different lengths: padding is exercised
    batch = data.Collator(processor, completion_only=True)(rows)
    for i, row in enumerate(rows):
        ids, labels = batch["input_ids"][i], batch["labels"][i]
        target = _decode(processor, ids[labels != data.IGNORE_INDEX].tolist())
        assert target == row["description"] + "<end_of_turn>\n"
        # everything before the answer, image block and turn markers included, is masked
        n_prompt = len(data.encode_text(processor, row)[0])
        assert (labels[:n_prompt] == data.IGNORE_INDEX).all()
        assert _decode(processor, ids[n_prompt - 7:n_prompt].tolist()) == "<start_of_turn>model\n"


def test_batch_shapes_and_image_tokens(processor, dataset):
    batch = data.Collator(processor)([dataset[0], dataset[1]])
    n, width = batch["input_ids"].shape
    assert batch["pixel_values"].shape == (2, 3, tiny.IMAGE_SIZE, tiny.IMAGE_SIZE)
    assert (batch["token_type_ids"].sum(dim=1) == tiny.MM_TOKENS).all()
    assert ((batch["input_ids"] == tiny.IMAGE_ID) == (batch["token_type_ids"] == 1)).all()
    pads = batch["attention_mask"] == 0
    assert (batch["input_ids"][pads] == tiny.PAD_ID).all()
    assert (batch["labels"][pads] == data.IGNORE_INDEX).all()
    assert batch["input_ids"][0, 0] == tiny.BOS_ID and (batch["input_ids"] == tiny.BOS_ID).sum() == n


def test_tutorial_masking_keeps_prompt(processor, dataset):
    batch = data.Collator(processor, completion_only=False)([dataset[0]])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    kept = ids[labels != data.IGNORE_INDEX]
    assert not ((kept == tiny.IMAGE_ID) | (kept == tiny.BOI_ID) | (kept == tiny.PAD_ID)).any()
    assert (kept == tiny.EOI_ID).any()  # the tutorial did not mask <end_of_image>
    assert len(kept) == len(ids) - 1 - tiny.MM_TOKENS - 1  # all but position 0, the image tokens and boi


def test_length_filter_is_exact(processor, dataset):
    lengths = data.sequence_lengths(processor, dataset)
    batch = data.Collator(processor)([dataset[i] for i in range(4)])
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths[:4]
    kept, dropped, longest = data.filter_by_length(dataset, processor, 512)
    assert dropped == 1 and len(kept) == len(dataset) - 1 and longest == max(lengths)
    limit = sorted(lengths)[len(lengths) // 2]
    kept, dropped, _ = data.filter_by_length(dataset, processor, limit)
    assert all(n <= limit for n in data.sequence_lengths(processor, kept))
    assert dropped == sum(1 for n in lengths if n > limit)


def test_label_positions_point_at_the_targets(processor, dataset):
    batch = data.Collator(processor)([dataset[i] for i in range(4)])
    labels, flat = batch["labels"], batch["label_positions"]
    rows, cols = flat // labels.shape[1], flat % labels.shape[1]
    assert (labels[rows, cols + 1] == batch["label_targets"]).all()
    assert len(flat) == int((labels[:, 1:] != data.IGNORE_INDEX).sum())
