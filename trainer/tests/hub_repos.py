"""The local cloud's Hugging Face Hub repositories, written from the tiny model.

    python tests/hub_repos.py [DEST]   (default: infra/localcloud/hub/repos)

The local cloud cannot reach the Hub, so its Hub (infra/localcloud/hub)
serves these files, committed beside it and embedded in it:

- models/gemma3-tiny/: the tiny Gemma 3's config and processor (tiny.py), the
  files every model repository of the local Hub holds besides its weights;
  the data check loads them as it loads google/gemma-3-4b-it's on GKE.
- datasets/amazon-product-descriptions-vlm/: a small dataset of the shape of
  the tutorial's philschmid/amazon-product-descriptions-vlm (its columns, 48
  rows of made-up products with generated PNG images), as the Hub serves a
  dataset: README.md whose YAML names the data files and features, and one
  Parquet file written by datasets (image structs of bytes and path, the
  features in the schema's metadata).

tests/test_hub_repos.py checks the committed files are what this writes.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny  # noqa: E402

DATASET_ROWS = 48
# The tutorial dataset's columns, in its order.
COLUMNS = ["Uniq Id", "Product Name", "Category", "Selling Price", "Model Number", "About Product",
           "Product Specification", "Technical Details", "Shipping Weight", "Variants", "Product Url",
           "Is Amazon Seller", "image", "description"]
SIZES = [(48, 40), (64, 64), (96, 72), (40, 56)]
NOUNS = {"Toys": "Toy Car", "Books": "Notebook", "Tools": "Screwdriver", "Garden": "Flower Pot"}

README = """---
license: cc-by-nc-4.0
task_categories:
- image-to-text
language:
- en
size_categories:
- n<1K
dataset_info:
  features:
{features}
  splits:
  - name: train
    num_examples: {rows}
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
---

# Product descriptions (local cloud)

A small dataset of the shape of philschmid/amazon-product-descriptions-vlm:
the same columns, {rows} made-up products, one generated image each. raydrop's
local cloud serves it in place of the tutorial's dataset, which it cannot reach.
"""


def _png(colour, size) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (245, 245, 245))
    w, h = size
    ImageDraw.Draw(img).rectangle([w // 6, h // 6, w - w // 6, h - h // 6], fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def dataset_rows():
    names = list(tiny.CATEGORIES)
    out = []
    for i in range(DATASET_ROWS):
        cat = names[i % len(names)]
        colour, desc = tiny.CATEGORIES[cat]
        noun = NOUNS[cat]
        out.append({
            "Uniq Id": hashlib.md5(f"product-{i}".encode()).hexdigest(),
            "Product Name": f"{noun} No. {i}",
            "Category": f"{cat} | {noun}s",
            "Selling Price": f"${5 + i % 17}.99",
            "Model Number": f"RD-{1000 + i}",
            "About Product": f"Make sure this fits by entering your model number. | A {noun.lower()} in one colour.",
            "Product Specification": f"ProductDimensions:{4 + i % 5} x 3 x 2 inches|ShippingWeight:{1 + i % 3} pounds",
            "Technical Details": "",
            "Shipping Weight": f"{1 + i % 3} pounds",
            "Variants": "",
            "Product Url": f"https://www.amazon.com/dp/RD{1000 + i}",
            "Is Amazon Seller": "Y",
            "image": {"bytes": _png(colour, SIZES[i % len(SIZES)]), "path": f"product-{i:02d}.png"},
            "description": f"{desc} Item {i} of the {cat.lower()} range, sturdy and light.",
        })
    return out


def write_dataset(dest: str) -> str:
    import datasets

    features = datasets.Features({c: datasets.Image() if c == "image" else datasets.Value("string") for c in COLUMNS})
    ds = datasets.Dataset.from_list(dataset_rows(), features=features)
    os.makedirs(os.path.join(dest, "data"), exist_ok=True)
    ds.to_parquet(os.path.join(dest, "data", "train-00000-of-00001.parquet"))
    lines = []
    for c in COLUMNS:
        lines.append(f"  - name: {c}\n    dtype: {'image' if c == 'image' else 'string'}")
    with open(os.path.join(dest, "README.md"), "w", encoding="utf-8") as f:
        f.write(README.format(features="\n".join(lines), rows=DATASET_ROWS))
    return dest


def write_model(dest: str) -> str:
    config = tiny.build_config()
    config.architectures = ["Gemma3ForConditionalGeneration"]  # as a model's save_pretrained records it
    config.save_pretrained(dest)
    tiny.build_processor().save_pretrained(dest)
    return dest


def write(root: str) -> str:
    write_model(os.path.join(root, "models", "gemma3-tiny"))
    write_dataset(os.path.join(root, "datasets", "amazon-product-descriptions-vlm"))
    return root


DEFAULT_DEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "infra", "localcloud", "hub",
                            "repos")

if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    print(write(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DEST)))
