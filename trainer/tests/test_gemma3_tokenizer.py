"""The prompt encoding and the length budget, against Gemma 3's real tokenizer
and chat template (RAYDROP_GEMMA3_TOKENIZER: a folder with tokenizer.json and
tokenizer_config.json; `make trainer-test` fetches it). The tiny model's
character tokenizer cannot show token merges at the prompt/answer boundary;
this can.
"""

from __future__ import annotations

import json
import os

import pytest

import cli
import data

TOKENIZER_DIR = os.environ.get("RAYDROP_GEMMA3_TOKENIZER", "")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(TOKENIZER_DIR, "tokenizer.json")),
    reason="RAYDROP_GEMMA3_TOKENIZER is not set (make trainer-test sets it)",
)

# The reference run: 1,583,017 tokens in 60 steps of 64 samples, at batch 1
# (no padding), so 412.2 tokens per sample, image block and template included.
TUTORIAL_TOKENS_PER_SAMPLE = 1_583_017 / (60 * 64)

ROWS = [
    {"Product Name": "Hasbro Marvel Avengers Titan Hero Series Iron Man 12-Inch Action Figure",
     "Category": "Toys & Games | Toy Figures & Playsets | Action Figures",
     "description": "Unleash the hero within with this 12-inch Iron Man figure.\n\nPerfect for kids 4+."},
    {"Product Name": "Café Bustelo — Espresso Ground Coffee, 10 oz",
     "Category": "Grocery & Gourmet Food",
     "description": "Bold, rich espresso-style coffee. Ideal for café con leche; vacuum-packed for freshness!"},
    {"Product Name": "  leading and trailing spaces  ", "Category": "Tools", "description": "  A tool.  "},
]


# The tutorial's prompt as its script wrote it (and as raydrop hard-coded it
# before the dataset format existed): the template format's defaults must
# encode every row to exactly these tokens.
TUTORIAL_SYSTEM = "You are an expert product description writer for Amazon."
TUTORIAL_USER = """Create a Short Product description based on the provided <PRODUCT> and <CATEGORY> and image.
Only return description. The description should be SEO optimized and for a better mobile search experience.

<PRODUCT>
{product}
</PRODUCT>

<CATEGORY>
{category}
</CATEGORY>
"""


def tutorial_tokens(processor, row):
    """The tutorial's encoding, written out independently of data.py."""
    msgs = [
        {"role": "system", "content": [{"type": "text", "text": TUTORIAL_SYSTEM}]},
        {"role": "user", "content": [
            {"type": "text", "text": TUTORIAL_USER.format(product=row["Product Name"], category=row["Category"])},
            {"type": "image"}]},
    ]
    prompt = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    msgs.append({"role": "assistant", "content": [{"type": "text", "text": row["description"]}]})
    full = processor.apply_chat_template(msgs, tokenize=False)
    completion = full[len(prompt):]
    prompt = prompt.replace(processor.boi_token, processor.full_image_sequence)
    tok = processor.tokenizer
    return tok(prompt, add_special_tokens=False)["input_ids"], tok(completion, add_special_tokens=False)["input_ids"]


def with_image(row):
    from PIL import Image

    return {**row, "image": Image.new("RGB", (500, 400))}


@pytest.fixture(scope="module")
def real_processor(gemma3_processor):
    return gemma3_processor


def test_it_is_gemma3s_tokenizer(real_processor):
    tok = real_processor.tokenizer
    assert tok.convert_tokens_to_ids(["<pad>", "<bos>", "<start_of_turn>", "<end_of_turn>"]) == [0, 2, 105, 106]
    assert tok.convert_tokens_to_ids(["<start_of_image>", "<end_of_image>", "<image_soft_token>"]) == [
        255999, 256000, 262144]


@pytest.mark.parametrize("row", ROWS)
def test_encoding_is_the_processors(real_processor, row):
    """Prompt and answer encoded apart (for the exact loss mask) give the very
    tokens the processor's own chat-template tokenisation gives the whole."""
    from PIL import Image

    row = with_image(row)
    prompt_ids, completion_ids = data.encode_text(real_processor, row)
    msgs = data.messages(row)
    msgs[1]["content"][1]["image"] = Image.new("RGB", (500, 400))
    whole = real_processor.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"][0]
    assert prompt_ids + completion_ids == list(whole)
    assert completion_ids[-2:] == real_processor.tokenizer.convert_tokens_to_ids(["<end_of_turn>", "\n"])
    assert prompt_ids.count(262144) == 256 and prompt_ids[0] == 2


@pytest.mark.parametrize("row", ROWS)
def test_tutorial_encoding_is_unchanged(real_processor, row):
    """The template format's defaults (and examples/gemma3-vision.json, whose
    dataset section the Go side checks equals them) give the tutorial's tokens."""
    row = with_image(row)
    want_prompt, want_completion = tutorial_tokens(real_processor, row)
    assert data.encode_text(real_processor, row) == (want_prompt, want_completion)
    ids, target = data.encode(real_processor, row, data.TUTORIAL)
    assert ids == want_prompt + want_completion
    assert target == [False] * len(want_prompt) + [True] * len(want_completion)
    example = os.path.join(os.path.dirname(cli.DEFAULTS_FILE), "..", "examples", "gemma3-vision.json")
    with open(example, encoding="utf-8") as f:
        fmt = data.Format.from_json(json.load(f).get("dataset"))
    assert data.encode(real_processor, row, fmt) == (ids, target)


def test_length_budget(real_processor):
    """What --max-seq-length leaves for the product name, category and
    description, against the reference run's mean sample."""
    empty = with_image({"Product Name": "", "Category": "", "description": ""})
    p, c = data.encode_text(real_processor, empty)
    fixed = len(p) + len(c)  # template, system prompt, instructions, the image block
    assert fixed == 336
    mean_fields = TUTORIAL_TOKENS_PER_SAMPLE - fixed  # about 76 tokens
    default = cli.parse_args(["--storage-path", "/s"]).max_seq_length
    print(f"fixed part {fixed} tokens; the reference's mean sample {TUTORIAL_TOKENS_PER_SAMPLE:.1f}, so "
          f"{mean_fields:.0f} tokens of fields; 512 leaves {512 - fixed} ({(512 - fixed) / mean_fields:.1f}x), "
          f"{default} leaves {default - fixed} ({(default - fixed) / mean_fields:.1f}x)")
    # 512 leaves about 2.3 times the mean for the fields: a long description
    # is left out. The default leaves about 9 times, and costs nothing (a
    # batch is padded to its longest row, not to --max-seq-length).
    assert (512 - fixed) / mean_fields < 2.5
    assert (default - fixed) / mean_fields > 8
