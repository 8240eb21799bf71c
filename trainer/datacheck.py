"""The data check: python datacheck.py --flag value ... (the trainer's own flags).

Runs on CPUs before any GPU worker is asked for. It reads the data exactly as
training will (the same source, format, split and hold-out), encodes every row
with the model's own processor and chat template, applies the same length
filter, decodes every image, and loads the model's config and processor to
refuse a model the trainer cannot fine-tune. It writes data-check.json to the
run's storage path (beside the attempts' experiment folders):

    {"schemaVersion": 1, "ok": true|false, "reason": "" | "InvalidData" | "InvalidModel",
     "message": "...", "rows": {...}, "leftOut": {...}, "tokens": {...}, "images": {...},
     "steps": {...}, "estimate": {...}, "seconds": ..., "rowsPerSecond": ...}

Exit code 0 when the data can be trained on, 4 when the data is unusable, 5
when the model is, 1 on any other failure (the pipeline retries those), 2 on
invalid flags.

Why no image processor: without pan-and-scan an image is always
processor.image_seq_length tokens (256 for Gemma 3), whatever its size, so the
lengths need only the tokenizer; decoding the image proves it can be read. The
check refuses a processor that has pan-and-scan switched on, since the count
would then depend on each image's shape.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cli  # noqa: E402
import data  # noqa: E402
import result  # noqa: E402
import weights  # noqa: E402

CHECK_FILE = "data-check.json"
SCHEMA_VERSION = 1
EXIT_INVALID_DATA = 4
EXIT_INVALID_MODEL = 5
# The model classes the trainer fine-tunes (model_type gemma3 with a vision tower).
ACCEPTED_ARCHITECTURES = ("Gemma3ForConditionalGeneration",)
ACCEPTED_MODEL_TYPE = "gemma3"
# Causes a row is left out for, as data-check.json names them.
TOO_LONG = "tooLong"
NO_ANSWER = "noAnswer"


class InvalidModel(ValueError):
    """The model cannot be fine-tuned by this trainer."""


def check_model(model_id: str, revision: Optional[str] = None):
    """The model's processor, after checking that the model is a Gemma 3 vision model."""
    from transformers import AutoConfig, AutoProcessor

    try:
        config = AutoConfig.from_pretrained(model_id, revision=revision)
    except Exception as exc:  # noqa: BLE001 - the message says what went wrong
        raise InvalidModel(f"model {model_id!r}: cannot load its config: {result.error_text(exc)}") from None
    arch = list(getattr(config, "architectures", None) or [])
    if getattr(config, "model_type", "") != ACCEPTED_MODEL_TYPE or not set(arch) & set(ACCEPTED_ARCHITECTURES):
        raise InvalidModel(
            f"model {model_id!r} is {', '.join(arch) or 'of no named architecture'} (model_type "
            f"{getattr(config, 'model_type', '?')!r}); accepted: {', '.join(ACCEPTED_ARCHITECTURES)} (model_type "
            f"{ACCEPTED_MODEL_TYPE!r}: the Gemma 3 vision models such as google/gemma-3-4b-it, -12b-it and -27b-it)")
    try:
        with _processor_repr_skipped():
            processor = AutoProcessor.from_pretrained(model_id, revision=revision, use_fast=True)
    except Exception as exc:  # noqa: BLE001
        raise InvalidModel(f"model {model_id!r}: cannot load its processor: {result.error_text(exc)}") from None
    if type(processor).__name__ != "Gemma3Processor":
        raise InvalidModel(f"model {model_id!r} has a {type(processor).__name__}, not a Gemma3Processor")
    if getattr(processor.image_processor, "do_pan_and_scan", False):
        raise InvalidModel(f"model {model_id!r}: its image processor has pan-and-scan on; the trainer encodes each "
                           f"image as one block of {processor.image_seq_length} tokens")
    return processor


@contextlib.contextmanager
def _processor_repr_skipped():
    """transformers 4.55 formats every processor it loads for an info line
    (``logger.info(f"Processor {processor}")`` in processing_utils), whether
    or not info is logged, and the format deep-copies the processor, Gemma 3's
    262k-token tokenizer included: about half of the processor's load time.
    While info is not logged, the format is skipped; nothing else reads it."""
    from transformers import processing_utils

    if processing_utils.logger.isEnabledFor(logging.INFO):
        yield
        return
    mixin = processing_utils.ProcessorMixin
    saved = mixin.__dict__["__repr__"]
    mixin.__repr__ = lambda self: f"<{type(self).__name__}>"
    try:
        yield
    finally:
        mixin.__repr__ = saved


def _percentile(sorted_values: List[int], p: float) -> int:
    if not sorted_values:
        return 0
    k = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return sorted_values[k]


# State shared with forked worker processes (set before the pool starts).
_WORK: Dict[str, Any] = {}


def _check_rows(bounds: Tuple[str, int, int]) -> Dict[str, Any]:
    """Encode rows [lo, hi) of a split and decode their images."""
    which, lo, hi = bounds
    ds, processor, fmt, max_len = _WORK[which], _WORK["processor"], _WORK["fmt"], _WORK["max_len"]
    out: Dict[str, Any] = {"lengths": [], "answers": [], "images": [], "sizes": [], "left": {}, "error": None}
    boi_id = processor.tokenizer.convert_tokens_to_ids(processor.boi_token)
    for i, row in data.iter_rows(ds, lo, hi):
        where = data.row_label(row, i)
        try:
            ids, target = data.encode(processor, row, fmt)
        except (KeyError, data.DataError) as exc:
            out["error"] = f"{where}: {exc}"
            return out
        except Exception as exc:  # noqa: BLE001 - a chat template refusing the turns, say
            out["error"] = f"{where}: cannot render the conversation: {result.error_text(exc)}"
            return out
        answer = sum(target)
        refs = data.row_images(row, fmt)
        n_boi = ids.count(boi_id)
        if n_boi != len(refs):
            out["error"] = (f"{where}: {n_boi} image placeholder(s) in the conversation for {len(refs)} image(s) in "
                            f"column(s) {fmt.image_columns()}")
            return out
        for ref in refs:
            try:
                img = data.open_image(ref)
                img.load()
                out["sizes"].append(img.size)
            except Exception as exc:  # noqa: BLE001 - any decoder error is the data's
                out["error"] = (f"{where} column {', '.join(repr(c) for c in fmt.image_columns())}: image "
                                f"{data.image_name(ref)} does not decode: {result.error_text(exc)}")
                return out
        cause = None
        if answer == 0 or not data.has_answer(row, fmt):
            cause = NO_ANSWER
        elif len(ids) > max_len:
            cause = TOO_LONG
        if cause:
            out["left"].setdefault(cause, []).append(i)
        out["lengths"].append(len(ids))
        out["answers"].append(answer if cause is None else 0)
        out["images"].append(len(refs))
    return out


def _scan(which: str, n: int, procs: int) -> Dict[str, Any]:
    chunk = max(64, min(2048, math.ceil(n / max(1, procs * 4))))
    bounds = [(which, lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
    parts: List[Dict[str, Any]]
    if procs > 1 and len(bounds) > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(procs) as pool:
            parts = pool.map(_check_rows, bounds)
    else:
        parts = [_check_rows(b) for b in bounds]
    merged: Dict[str, Any] = {"lengths": [], "answers": [], "images": [], "sizes": [], "left": {}, "error": None}
    for p in parts:
        if p["error"] and merged["error"] is None:
            merged["error"] = p["error"]
        for k in ("lengths", "answers", "images", "sizes"):
            merged[k].extend(p[k])
        for cause, rows in p["left"].items():
            merged["left"].setdefault(cause, []).extend(rows)
    return merged


def resolve_revision(source: str, revision: str) -> str:
    """The commit a Hub dataset's revision (a branch, a tag, or none: the
    default branch) points at now, so that training reads exactly the data
    checked; the revision as given where the Hub cannot be asked (offline,
    or a source that is not on the Hub). DataError when the Hub says the
    dataset or the revision does not exist, or that the deployment's token
    may not read its files (a gated dataset): datasets would otherwise load
    a copy it has cached under the same name, whatever the revision."""
    if not data.is_hub_id(source):
        return revision
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi()
    try:
        sha = api.dataset_info(source, revision=revision or None).sha or revision
        api.auth_check(source, repo_type="dataset")
        return sha
    except RevisionNotFoundError:
        raise data.DataError(f"dataset {source!r} has no revision {revision!r} on the Hub (dataset.revision: a branch, "
                             f"a tag or a commit of it)") from None
    except GatedRepoError as exc:
        token = "is not set (HF_TOKEN)" if exc.response is not None and exc.response.status_code == 401 else \
            "belongs to an account that has not been granted access"
        raise data.DataError(f"dataset {source!r} is gated on the Hub and the deployment's Hub token {token}: accept "
                             f"its terms at https://huggingface.co/datasets/{source} with the token's account") from None
    except RepositoryNotFoundError:
        raise data.DataError(f"dataset {source!r} does not exist on the Hub, or it is private and the deployment's Hub "
                             f"token cannot read it (dataset.id)") from None
    except Exception as exc:  # noqa: BLE001 - loading the data says what is wrong, if anything
        print(f"raydrop: cannot resolve {source}@{revision or 'default'} to a commit: {result.error_text(exc)}",
              flush=True)
        return revision


def optimizer_steps(rows: int, args) -> Dict[str, int]:
    """The optimizer steps transformers' Trainer will take (4.55: a distributed
    sampler pads each rank to ceil(rows / world), then ceil over the batch and
    the accumulation)."""
    per_rank = math.ceil(rows / args.num_workers)
    batches = math.ceil(per_rank / args.per_device_batch_size)
    per_epoch = max(batches // args.gradient_accumulation_steps
                    + int(batches % args.gradient_accumulation_steps > 0), 1)
    total = args.max_steps if args.max_steps and args.max_steps > 0 else math.ceil(args.epochs * per_epoch)
    return {"perEpoch": per_epoch, "total": total}


def stage_model(args) -> None:
    """Stage the model now, on the head, before any GPU worker exists, when this run is
    the one that stages it (--stage-model true): training then reads it from the bucket.
    A run that does not stage it does not wait for it here: its training driver does.
    A snapshot with no weights is an unusable model; any other failure (the Hub, the
    bucket) leaves the staging to the training driver, and the check goes on."""
    if not (args.staged_model and args.stage_model):
        return
    try:
        weights.stage(args.model_id, args.model_revision, args.staged_model, args.run_id,
                      lambda msg: print(f"raydrop: {msg}", flush=True))
    except ValueError as exc:
        raise InvalidModel(f"model {args.model_id!r} at {args.model_revision}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the training driver stages it instead
        print(f"raydrop: could not stage the model at {args.staged_model}: {result.error_text(exc)}; "
              "the training attempt stages it", flush=True)


def run_check(args) -> Dict[str, Any]:
    """The check's document; raises DataError or InvalidModel on unusable input."""
    start = time.time()
    fmt = data.Format.from_json(json.loads(args.dataset_format) if args.dataset_format else None)
    processor = check_model(args.model_id, None if args.staged_model else args.model_revision or None)
    stage_model(args)
    revision = resolve_revision(args.dataset_id, args.dataset_revision)
    train = data.load_rows(args.dataset_id, args.dataset_split, fmt, revision)
    evalset = data.load_rows(args.dataset_id, args.eval_split, fmt, revision) if args.eval_split else None
    procs = max(1, args.check_processes or os.cpu_count() or 1)
    _WORK.update(train=train, eval=evalset, processor=processor, fmt=fmt, max_len=args.max_seq_length)
    try:
        scan = _scan("train", len(train), procs)
        if scan["error"]:
            raise data.DataError(scan["error"])
        escan = _scan("eval", len(evalset), procs) if evalset is not None else None
        if escan is not None and escan["error"]:
            raise data.DataError(escan["error"])
    finally:
        _WORK.clear()
    rows = len(train)
    left_rows = sorted(i for v in scan["left"].values() for i in v)
    left = {cause: len(v) for cause, v in sorted(scan["left"].items())}
    dropped = len(left_rows)
    if dropped == rows:
        raise data.DataError(f"no row of split {args.dataset_split!r} can be trained on: {left}")
    if rows and dropped / rows > args.max_dropped_share:
        longest = max(scan["lengths"]) if scan["lengths"] else 0
        raise data.DataError(
            f"{dropped} of {rows} rows ({100.0 * dropped / rows:.1f} %) are left out ({_causes(left)}), more than "
            f"training.maxDroppedShare {args.max_dropped_share:g} allows (the longest row has {longest} tokens "
            f"against training.maxSeqLength {args.max_seq_length}): raise training.maxSeqLength or "
            f"training.maxDroppedShare, or shorten the rows")
    left_set = set(left_rows)
    kept = [i for i in range(rows) if i not in left_set]
    lengths = [scan["lengths"][i] for i in kept]
    # The hold-out is drawn after the filter, as training draws it.
    if evalset is None and args.eval_share > 0:
        n = len(kept)
        if n < 2:
            raise data.DataError(f"{n} row(s) left to train on: too few to hold out rows for evaluation; "
                                 f"set dataset.evalShare to 0")
        eval_n = min(max(1, round(n * args.eval_share)), n - 1)
    else:
        eval_n = 0
    train_n = len(kept) - eval_n
    # Token totals of the hold-out are the kept rows' mean times its size: the
    # exact draw is training's, and the split's totals are what an estimate needs.
    mean_len = sum(lengths) / len(lengths) if lengths else 0.0
    train_tokens = round(mean_len * train_n)
    eval_tokens = round(mean_len * eval_n) if evalset is None else sum(escan["lengths"])
    steps = optimizer_steps(train_n, args)
    epochs_run = steps["total"] / steps["perEpoch"] if steps["perEpoch"] else 0
    tokens_to_train = train_tokens * epochs_run
    gpus = args.num_workers
    seconds = tokens_to_train / (args.estimate_tokens_per_gpu_second * gpus) if args.estimate_tokens_per_gpu_second else 0
    gpu_hours = seconds * gpus / 3600.0
    sizes = scan["sizes"]
    per_row: Dict[str, int] = {}
    for n in scan["images"]:
        per_row[str(n)] = per_row.get(str(n), 0) + 1
    sorted_lengths = sorted(lengths)
    elapsed = time.time() - start
    checked = rows + (len(evalset) if evalset is not None else 0)
    return {
        "schemaVersion": SCHEMA_VERSION, "ok": True, "reason": "", "message": "",
        "dataset": {"source": args.dataset_id, "split": args.dataset_split, "evalSplit": args.eval_split,
                    "revision": args.dataset_revision, "resolvedRevision": revision if revision != args.dataset_revision
                    else "", "format": fmt.kind},
        "model": args.model_id,
        "rows": {"total": rows, "kept": len(kept), "train": train_n, "eval": eval_n if evalset is None else len(evalset),
                 "leftOut": dropped},
        "leftOut": left,
        "leftOutRows": {cause: v[:20] for cause, v in sorted(scan["left"].items())},
        "tokens": {"p50": _percentile(sorted_lengths, 50), "p90": _percentile(sorted_lengths, 90),
                   "max": sorted_lengths[-1] if sorted_lengths else 0, "maxSeqLength": args.max_seq_length,
                   "answer": sum(scan["answers"]), "train": train_tokens, "eval": eval_tokens,
                   "imageBlock": processor.image_seq_length},
        "images": {"total": len(sizes), "perRow": per_row,
                   "width": _spread([w for w, _ in sizes]), "height": _spread([h for _, h in sizes])},
        "steps": steps,
        "estimate": {"tokensPerGpuSecond": args.estimate_tokens_per_gpu_second, "gpus": gpus,
                     "seconds": round(seconds, 1), "gpuHours": round(gpu_hours, 3),
                     "usd": round(gpu_hours * args.gpu_hour_usd, 2), "gpuHourUsd": args.gpu_hour_usd},
        "processes": procs,
        "seconds": round(elapsed, 3),
        "rowsPerSecond": round(checked / elapsed, 1) if elapsed > 0 else None,
    }


def _causes(left: Dict[str, int]) -> str:
    words = {TOO_LONG: "longer than training.maxSeqLength", NO_ANSWER: "with an empty answer"}
    return ", ".join(f"{n} {words.get(c, c)}" for c, n in left.items())


def _spread(values: List[int]) -> Dict[str, int]:
    if not values:
        return {"min": 0, "p50": 0, "max": 0}
    s = sorted(values)
    return {"min": s[0], "p50": _percentile(s, 50), "max": s[-1]}


def write(storage_path: str, doc: Dict[str, Any]) -> str:
    storage_path = result.normalize_storage_path(storage_path)
    fs, base = result.filesystem(storage_path)
    fs.create_dir(base, recursive=True)
    import posixpath

    with fs.open_output_stream(posixpath.join(base, CHECK_FILE)) as f:
        f.write((json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return result.join(storage_path, CHECK_FILE)


def main(argv: Optional[List[str]] = None) -> int:
    args = cli.parse_args(argv)
    try:
        doc = run_check(args)
        code = 0
    except data.DataError as exc:
        doc, code = _failed("InvalidData", str(exc), args), EXIT_INVALID_DATA
    except InvalidModel as exc:
        doc, code = _failed("InvalidModel", str(exc), args), EXIT_INVALID_MODEL
    where = write(args.storage_path, doc)
    verdict = "ok" if doc["ok"] else f"{doc['reason']}: {doc['message']}"
    print(f"raydrop: data check {verdict}; wrote {where}", flush=True)
    return code


def _failed(reason: str, message: str, args) -> Dict[str, Any]:
    secrets = [os.environ.get("HF_TOKEN", ""), os.environ.get("HUGGING_FACE_HUB_TOKEN", "")]
    return {"schemaVersion": SCHEMA_VERSION, "ok": False, "reason": reason, "message": result.redact(message, secrets),
            "dataset": {"source": args.dataset_id, "split": args.dataset_split, "evalSplit": args.eval_split,
                        "revision": args.dataset_revision}, "model": args.model_id}


if __name__ == "__main__":
    sys.exit(main())
