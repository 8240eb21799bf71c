"""Data-check throughput: rows per second per CPU core, on JPEG images and
Gemma 3's real tokenizer and chat template (RAYDROP_GEMMA3_TOKENIZER), the
way datacheck.py runs on the Ray head before any GPU worker is asked for.

    python bench/datacheck_bench.py [--rows 2000] [--processes 1,2]

Prints one line per process count and the anchor: at least 150 rows/s per
core (100,000 image rows in 30 s on the head's 24 CPUs).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

ANCHOR_ROWS_PER_CORE = 150.0


def gemma3_model_dir(root: str) -> str:
    """A model folder whose processor is Gemma 3's real one (896-pixel images,
    256 tokens each) and whose config is the tiny test model's: the check
    reads only the config's architecture and the processor."""
    import tiny

    proc = tiny.gemma3_processor(os.environ["RAYDROP_GEMMA3_TOKENIZER"])
    path = os.path.join(root, "model")
    proc.save_pretrained(path)
    config = tiny.build_config()
    config.architectures = ["Gemma3ForConditionalGeneration"]
    config.save_pretrained(path)
    return path


def write_rows(folder: str, n: int) -> None:
    """n rows in the ImageFolder layout: a 500x400 JPEG each and a sentence of text."""
    from PIL import Image

    rng = random.Random(0)
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    distinct = []
    for k in range(16):
        img = Image.effect_noise((500, 400), 40 + k).convert("RGB")
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=85)
        distinct.append(buf.getvalue())
    with open(os.path.join(folder, "metadata.jsonl"), "w", encoding="utf-8") as f:
        for i in range(n):
            with open(os.path.join(folder, "images", f"{i:06d}.jpg"), "wb") as g:
                g.write(distinct[i % len(distinct)])
            words = " ".join(rng.choice(["red", "square", "left", "circle", "small", "blue", "top"])
                             for _ in range(rng.randint(8, 40)))
            f.write(json.dumps({"file_name": f"images/{i:06d}.jpg", "question": "What is in the picture?",
                                "answer": words}) + "\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--processes", default="1,2")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datacheck

    root = tempfile.mkdtemp(prefix="datacheck-bench-")
    model = gemma3_model_dir(root)
    data_dir = os.path.join(root, "data")
    write_rows(data_dir, args.rows)
    fmt = {"format": "template", "template": {"system": "", "prompt": "{question}", "answer": "answer",
                                              "images": ["image"]}}
    out = []
    for procs in [int(x) for x in args.processes.split(",")]:
        storage = os.path.join(root, f"run-{procs}")
        start = time.time()
        code = datacheck.main(["--storage-path", storage, "--model-id", model, "--dataset-id", data_dir,
                               "--dataset-format", json.dumps(fmt), "--check-processes", str(procs),
                               "--num-workers", "16", "--eval-share", "0.05"])
        wall = time.time() - start
        with open(os.path.join(storage, datacheck.CHECK_FILE), encoding="utf-8") as f:
            doc = json.load(f)
        if code != 0:
            print(json.dumps(doc, indent=2))
            return 1
        per_core = args.rows / wall / procs
        out.append({"processes": procs, "rows": args.rows, "seconds": round(wall, 2),
                    "rowsPerSecond": round(args.rows / wall, 1), "rowsPerSecondPerCore": round(per_core, 1)})
        print(f"datacheck: {args.rows} JPEG rows, {procs} process(es): {wall:.2f} s, {args.rows / wall:.0f} rows/s, "
              f"{per_core:.0f} rows/s per core (anchor: {ANCHOR_ROWS_PER_CORE:.0f}; 100,000 rows on 24 CPUs "
              f"would take {100000 / (per_core * 24):.0f} s against 30 s)", flush=True)
    print(json.dumps({"datacheck": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
