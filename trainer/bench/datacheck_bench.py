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
EXAMPLE_ROWS = 1345  # philschmid/amazon-product-descriptions-vlm, the tutorial's dataset
HEAD_CPUS = 24  # the head pod's CPU request (cluster.head.cpu)


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
    def run(folder: str, name: str, procs: int) -> float:
        storage = os.path.join(root, name)
        start = time.time()
        code = datacheck.main(["--storage-path", storage, "--model-id", model, "--dataset-id", folder,
                               "--dataset-format", json.dumps(fmt), "--check-processes", str(procs),
                               "--num-workers", "16", "--eval-share", "0.05"])
        wall = time.time() - start
        if code != 0:
            with open(os.path.join(storage, datacheck.CHECK_FILE), encoding="utf-8") as f:
                raise SystemExit(f"the data check refused the bench data: {f.read()}")
        return wall

    # The fixed start-up a check pays whatever its size (the imports, the
    # processor, the storage): a check of a few rows, first, in this process;
    # the timed checks after it find the imports done and measure the rows.
    write_rows(os.path.join(root, "few"), 20)
    fixed = run(os.path.join(root, "few"), "run-few", 1)
    print(f"datacheck: fixed start-up {fixed:.2f} s (a check of 20 rows)", flush=True)
    out = []
    for procs in [int(x) for x in args.processes.split(",")]:
        wall = run(data_dir, f"run-{procs}", procs)
        per_core = args.rows / wall / procs
        out.append({"processes": procs, "rows": args.rows, "seconds": round(wall, 2),
                    "rowsPerSecond": round(args.rows / wall, 1), "rowsPerSecondPerCore": round(per_core, 1),
                    "startupSeconds": round(fixed, 2)})
        print(f"datacheck: {args.rows} JPEG rows, {procs} process(es): {wall:.2f} s, {args.rows / wall:.0f} rows/s, "
              f"{per_core:.0f} rows/s per core (anchor: {ANCHOR_ROWS_PER_CORE:.0f}; 100,000 rows on 24 CPUs "
              f"would take {100000 / (per_core * 24):.0f} s against 30 s)", flush=True)
    # The example run's data check (examples/gemma3-vision.json: the
    # tutorial's 1,345 rows, one image each) on the head's 24 CPUs, at the
    # best rate measured per core, plus the fixed start-up.
    per_core = max(r["rowsPerSecondPerCore"] for r in out)
    example = EXAMPLE_ROWS / (per_core * HEAD_CPUS) + fixed
    print(f"datacheck: the example run ({EXAMPLE_ROWS:,} rows) adds about {example:.0f} s on the head's {HEAD_CPUS} CPUs "
          f"({fixed:.1f} s of it fixed start-up), before any GPU worker is asked for; the runtime env's install on the "
          f"head comes on top until a prebuilt image exists", flush=True)
    print(json.dumps({"datacheck": out, "exampleRunSeconds": round(example, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
