"""Dataset sources and formats: ImageFolder (metadata.jsonl / .csv), JSON Lines
and Parquet with relative, data: and embedded images; the template and
messages formats; the exact target mask of multi-turn conversations."""

from __future__ import annotations

import json
import os

import pytest

import data
import tiny

COLOUR_TEMPLATE = {
    "format": "template",
    "template": {"system": "", "prompt": "{question} Answer in one word, {{like this}}.", "answer": "colour",
                 "images": ["image"], "imagePlacement": "beforePrompt"},
}


def _decode(processor, ids):
    return "".join(processor.tokenizer.convert_ids_to_tokens(ids))


@pytest.mark.parametrize("metadata", ["metadata.jsonl", "metadata.csv"])
def test_imagefolder_in_the_users_columns(tmp_path, processor, metadata):
    folder = tiny.write_imagefolder(str(tmp_path / "shapes"), n=8, metadata=metadata)
    fmt = data.Format.from_json(COLOUR_TEMPLATE)
    ds = data.load_rows("file://" + folder, "train", fmt)
    assert len(ds) == 8 and ds[1]["colour"] == "blue"
    msgs = data.conversation(ds[1], fmt)
    assert [m["role"] for m in msgs] == ["user", "assistant"]  # no system message asked for
    assert msgs[0]["content"][0] == {"type": "image"}
    assert msgs[0]["content"][1]["text"] == "What colour is the square? Answer in one word, {like this}."
    batch = data.Collator(processor, fmt=fmt)([ds[0], ds[1]])
    assert batch["pixel_values"].shape[0] == 2
    for i, colour in enumerate(["red", "blue"]):
        labels = batch["labels"][i]
        assert _decode(processor, batch["input_ids"][i][labels != data.IGNORE_INDEX].tolist()) == \
            colour + "<end_of_turn>\n"


def test_messages_with_zero_one_and_two_images(tmp_path, processor):
    folder = tiny.write_messages_jsonl(str(tmp_path / "conv"), n=6)
    fmt = data.Format.from_json({"format": "messages"})
    ds = data.load_rows(folder, "train", fmt)
    assert [len(data.row_images(ds[i], fmt)) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    batch = data.Collator(processor, fmt=fmt)([ds[i] for i in range(3)])
    assert batch["pixel_values"].shape[0] == 3  # 0 + 1 + 2 images, in order
    assert (batch["token_type_ids"].sum(dim=1) == torch_tensor([0, 1, 2]) * tiny.MM_TOKENS).all()
    # Every assistant turn is a target; nothing else is.
    targets = _decode(processor, batch["input_ids"][2][batch["labels"][2] != data.IGNORE_INDEX].tolist())
    assert targets == "2.<end_of_turn>\n" + "green.<end_of_turn>\n"
    # A batch of text-only rows carries no pixel values.
    text_only = data.Collator(processor, fmt=fmt)([ds[0], ds[3]])
    assert "pixel_values" not in text_only and int(text_only["token_type_ids"].sum()) == 0


def torch_tensor(values):
    import torch

    return torch.tensor(values)


def test_messages_images_embedded_as_data_uris(tmp_path, processor):
    folder = tiny.write_messages_jsonl(str(tmp_path / "emb"), n=3, embed=True)
    fmt = data.Format.from_json({"format": "messages"})
    ds = data.load_rows(folder, "train", fmt)
    img = data.open_image(data.row_images(ds[2], fmt)[1])
    assert img.size == (40, 32) and img.convert("RGB").getpixel((0, 0)) == tiny.COLOURS["yellow"]


def test_parquet_with_embedded_bytes(tmp_path, processor):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "pq"
    folder.mkdir()
    table = pa.table({
        "image": [{"bytes": tiny.png("red"), "path": None}, {"bytes": tiny.png("green"), "path": None}],
        "question": ["Colour?", "Colour?"], "colour": ["red", "green"],
    })
    pq.write_table(table, str(folder / "train-00000.parquet"))
    fmt = data.Format.from_json(COLOUR_TEMPLATE)
    ds = data.load_rows(str(folder), "train", fmt)
    assert data.open_image(ds[1]["image"]).convert("RGB").getpixel((1, 1)) == tiny.COLOURS["green"]
    data.Collator(processor, fmt=fmt)([ds[0], ds[1]])


def test_split_folders_and_split_named_files(tmp_path):
    fmt = data.Format.from_json(COLOUR_TEMPLATE)
    root = tmp_path / "splits"
    tiny.write_imagefolder(str(root / "train"), n=4)
    tiny.write_imagefolder(str(root / "test"), n=2)
    assert len(data.load_rows(str(root), "train", fmt)) == 4
    assert len(data.load_rows(str(root), "test", fmt)) == 2
    with pytest.raises(data.DataError, match=r"no data for split 'validation'"):
        data.load_rows(str(root), "validation", fmt)


def test_placeholders():
    assert data.placeholders("{a} and {b c} and {a} {{x}}") == ["a", "b c"]
    assert data.render("{a}-{{b}}-{n}", {"a": "A", "n": 3}) == "A-{b}-3"
    for bad, where in (("{a", "lone '{'"), ("a}", "lone '}'"), ("{}", "empty placeholder")):
        with pytest.raises(data.DataError, match=where):
            data.placeholders(bad)


def test_format_defaults_are_the_tutorials():
    assert data.Format.from_json(None) == data.TUTORIAL
    assert data.Format.from_json({"format": "template"}) == data.TUTORIAL
    assert data.TUTORIAL.columns() == ["Product Name", "Category", "description", "image"]


@pytest.mark.parametrize("case,match", [
    ("missing-column", r"lacks column\(s\) \['colour'\]"),
    ("image-outside", r"line 1: image '../../etc/passwd' points outside"),
    ("absolute-image", r"must be relative to the data file or a gs:// URI"),
    ("not-json", r"metadata.jsonl line 2: not JSON"),
    ("no-file-name", r"metadata.jsonl line 1: no 'file_name'"),
    ("empty", r"has no rows|no data for split"),
])
def test_bad_sources_name_the_file_and_line(tmp_path, case, match):
    folder = tmp_path / case
    folder.mkdir()
    lines = {
        "missing-column": ['{"file_name": "a.png", "question": "q"}'],
        "image-outside": ['{"file_name": "../../etc/passwd", "question": "q", "colour": "red"}'],
        "absolute-image": ['{"file_name": "/etc/passwd", "question": "q", "colour": "red"}'],
        "not-json": ['{"file_name": "a.png", "question": "q", "colour": "red"}', '{oops'],
        "no-file-name": ['{"question": "q", "colour": "red"}'],
        "empty": [],
    }[case]
    (folder / "metadata.jsonl").write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(data.DataError, match=match):
        data.load_rows(str(folder), "train", data.Format.from_json(COLOUR_TEMPLATE))


def test_dataset_format_flag_reads_the_environment(monkeypatch):
    import importlib

    import cli

    monkeypatch.setenv(cli.DATASET_FORMAT_ENV, json.dumps(COLOUR_TEMPLATE))
    importlib.reload(cli)
    try:
        args = cli.parse_args(["--storage-path", "/s"])
        assert json.loads(args.dataset_format) == COLOUR_TEMPLATE
    finally:
        monkeypatch.delenv(cli.DATASET_FORMAT_ENV)
        importlib.reload(cli)
    with pytest.raises(SystemExit):
        cli.parse_args(["--storage-path", "/s", "--dataset-format", "[1]"])


def test_template_free_text_arrives_byte_for_byte(processor):
    """Quotes, $(...), backticks, newlines and non-ASCII text in a template are
    data: they reach the encoding unchanged."""
    nasty = "It's \"$(rm -rf /)\" `id` ; echo $HOME\n\tcafé — 日本語 {{literal}} {colour}"
    fmt = data.Format.from_json({"format": "template", "template": {
        "system": "sys $(x) 'q'", "prompt": nasty, "answer": "colour", "images": []}})
    row = {"colour": "red", "question": "", "_source": "x"}
    msgs = data.conversation(row, fmt)
    assert msgs[1]["content"][0]["text"] == nasty.replace("{{literal}}", "{literal}").replace("{colour}", "red")
    assert os.environ.get("HOME")  # nothing above ran a shell
