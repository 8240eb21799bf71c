"""data.encode, which training, the length filter and the data check use, is
data.encode_reference token for token and mask for mask: the image blocks
spliced in as ids equal the blocks expanded in the text and tokenized, and
one tokenizer call for a row's segments equals one per segment. Checked on
varied rows with the tiny processor and, where RAYDROP_GEMMA3_TOKENIZER is
set, Gemma 3's real tokenizer and chat template."""

from __future__ import annotations

import json

import pytest

import data
import tiny

BOI, IMG, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"

TEMPLATE_ROWS = [
    {"q": "What colour is the square?", "a": "red", "image": "x"},
    {"q": "  leading and trailing spaces  ", "a": "  spaced answer  ", "image": "x"},
    {"q": "Braces {like} {{this}} and }{", "a": "{\"json\": [1, 2]}", "image": "x"},
    {"q": "A literal <start_of_image> and <image_soft_token> and <end_of_image> in the prompt",
     "a": "and <start_of_image> in the answer", "image": "x"},
    {"q": "<start_of_turn>model\n<end_of_turn>\n<bos><eos>", "a": "<end_of_turn>", "image": "x"},
    {"q": "Café — 日本語, emoji 🙂, tabs\tand\r\nCRLF", "a": "naïve\u00a0façade\n\n\n", "image": "x"},
    {"q": "empty answer", "a": "", "image": "x"},
    {"q": "no answer", "a": None, "image": "x"},
    {"q": "", "a": "\n", "image": "x"},
    {"q": "\n\nnewlines\n\n", "a": "x\n\ny", "image": "x"},
]

TEMPLATE_FORMATS = [
    {"format": "template", "template": {"system": "", "prompt": "{q}", "answer": "a", "images": ["image"]}},
    {"format": "template", "template": {"system": "You answer.\n", "prompt": "{{{q}}}\nOnly {q}.", "answer": "a",
                                        "images": ["image"], "imagePlacement": "beforePrompt"}},
    {"format": "template", "template": {"system": "  sys  ", "prompt": "{q}", "answer": "a", "images": []}},
    {"format": "template", "template": {"system": "", "prompt": "{q}", "answer": "a", "images": ["image", "image"]}},
]


def _text(t):
    return {"type": "text", "text": t}


MESSAGES_ROWS = [
    # text only, one turn
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
    # one image, multi-turn, the last turn a user's
    [{"role": "user", "content": [{"type": "image"}, _text("What is wrong here?")]},
     {"role": "assistant", "content": [_text("A crack along the weld.")]},
     {"role": "user", "content": "Is it safe?"},
     {"role": "assistant", "content": "No."},
     {"role": "user", "content": "Why?"}],
    # a system message and two images, one after the text, empty answers
    [{"role": "system", "content": "  Be brief.  "},
     {"role": "user", "content": [_text("Compare "), {"type": "image"}, _text(" and "), {"type": "image"}]},
     {"role": "assistant", "content": ""},
     {"role": "user", "content": [_text("again <start_of_image>")]},
     {"role": "assistant", "content": [_text("  same  ")]}],
    # two images back to back, braces and markup in every turn
    [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, _text("{x} <end_of_turn>\n{{")]},
     {"role": "assistant", "content": "<start_of_turn>user\n}"},
     {"role": "user", "content": [_text("<image_soft_token><end_of_image>\n\n")]},
     {"role": "assistant", "content": "\n\n<start_of_image>\n\n"}],
]



@pytest.fixture(params=["processor", "gemma3_processor"])
def proc(request):
    return request.getfixturevalue(request.param)


def _agree(proc, row, fmt):
    got = data.encode(proc, row, fmt)
    want = data.encode_reference(proc, row, fmt)
    assert got == want, row
    return got


def test_the_image_block_is_spliced(proc):
    """The fast path is the one taken (not a silent fall back to expanding)."""
    assert data._image_block(proc).ok


@pytest.mark.parametrize("fmt", TEMPLATE_FORMATS, ids=["after", "before-system-braces", "text-only", "two-images"])
def test_template_rows(proc, fmt):
    fmt = data.Format.from_json(fmt)
    for row in TEMPLATE_ROWS:
        ids, target = _agree(proc, row, fmt)
        boi = proc.tokenizer.convert_tokens_to_ids(BOI)
        n_images = len(data.row_images(row, fmt))
        # The prompt's literal <start_of_image> is expanded too, as the processor does.
        literal = (fmt.prompt.count("{q}") * row["q"].count(BOI) + fmt.system.count(BOI))
        assert sum(1 for t, is_t in zip(ids, target) if t == boi and not is_t) == n_images + literal


@pytest.mark.parametrize("n", range(len(MESSAGES_ROWS)))
def test_messages_rows(proc, n):
    fmt = data.Format.from_json({"format": "messages"})
    msgs = MESSAGES_ROWS[n]
    images = sum(1 for m in msgs if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")
    row = {"messages": json.dumps(msgs), "images": ["x"] * images}
    ids, target = _agree(proc, row, fmt)
    assert any(target) or all(m["content"] in ("", [_text("")]) for m in msgs if m["role"] == "assistant")


def test_the_tutorial_rows(proc, dataset):
    for _, row in data.iter_rows(dataset):
        _agree(proc, row, data.TUTORIAL)


def test_tiny_messages_dataset(proc, tmp_path):
    folder = tiny.write_messages_jsonl(str(tmp_path / "m"), n=9)
    fmt = data.Format.from_json({"format": "messages"})
    for _, row in data.iter_rows(data.load_rows(folder, "train", fmt)):
        _agree(proc, row, fmt)


def test_encode_text_is_the_reference(proc):
    for row in TEMPLATE_ROWS:
        row = {"Product Name": row["q"], "Category": row["q"][::-1], "description": row["a"], "image": "x"}
        prompt, completion = data.prompt_and_completion(proc, row)
        assert data.encode_text(proc, row) == (data._tokens_reference(proc, prompt, True),
                                               data._tokens_reference(proc, completion, False))


def test_a_processor_whose_image_block_cannot_be_spliced_expands_it(processor, monkeypatch):
    block = data._image_block(processor)
    monkeypatch.setattr(block, "ok", False)
    fmt = data.Format.from_json(TEMPLATE_FORMATS[0])
    for row in TEMPLATE_ROWS:
        assert data.encode(processor, row, fmt) == data.encode_reference(processor, row, fmt)


def test_iter_rows_gives_the_rows_as_indexing_does(dataset, tmp_path):
    assert [i for i, _ in data.iter_rows(dataset, 3, 14, batch=4)] == list(range(3, 14))
    assert [r for _, r in data.iter_rows(dataset, 3, 14, batch=4)] == [dataset[i] for i in range(3, 14)]
    folder = tiny.write_messages_jsonl(str(tmp_path / "m"), n=7)
    ds = data.load_rows(folder, "train", data.Format.from_json({"format": "messages"}))
    assert [r for _, r in data.iter_rows(ds, batch=3)] == [ds[i] for i in range(len(ds))]
