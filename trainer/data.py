"""The dataset: where the rows come from, how a row becomes a conversation, its
exact encoding, the length filter and the batch collator.

Two formats (``Format``):

* ``template``: the spec turns column rows into a conversation: an optional
  system message, a user prompt whose ``{column}`` placeholders are filled
  from the row, the row's image column(s), and the answer column as the
  assistant's turn. The reference tutorial is this format with its own prompt
  and columns (``TUTORIAL``), and encodes token for token as it always did.
* ``messages``: the conversational format TRL documents for vision-language
  models: a ``messages`` column of ``{"role", "content"}`` turns whose content
  is text or a list of ``{"type": "text", "text": ...}`` and ``{"type":
  "image"}`` parts, and an ``images`` column with one image per placeholder
  (none, one or several). Every assistant turn is a target.

Sources (``load_rows``): a Hugging Face Hub dataset id (optionally at a
revision), a ``save_to_disk`` folder, or a folder (local or ``gs://``) in the
ImageFolder layout (images beside ``metadata.jsonl`` or ``metadata.csv`` with a
``file_name`` column) or holding JSON Lines / Parquet files whose image fields
are paths relative to the file, ``gs://`` URIs, or embedded bytes.

Images stay undecoded references until the collator needs them, so each
worker decodes only its own shard. Every row is encoded as alternating
non-target / target token runs, and the length filter uses the very same
encoding, so --max-seq-length is exact.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import result
from cli import DEFAULTS

IGNORE_INDEX = -100

# The tutorial's prompt and columns: the template format's defaults, shared
# with the job spec through defaults.json (the Go side embeds the same file).
_TEMPLATE_DEFAULTS = DEFAULTS["template"]
_MESSAGES_DEFAULTS = DEFAULTS["messages"]
SYSTEM_MESSAGE = _TEMPLATE_DEFAULTS["system"]
TUTORIAL_PROMPT = _TEMPLATE_DEFAULTS["prompt"]

# Where the images of a template row go in the user's turn.
IMAGES_AFTER = "afterPrompt"
IMAGES_BEFORE = "beforePrompt"

# ImageFolder's names (Hugging Face datasets' imagefolder builder).
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
FILE_NAME_COLUMN = "file_name"
IMAGEFOLDER_IMAGE_COLUMN = "image"
DATA_SUFFIXES = (".jsonl", ".parquet")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")

PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class DataError(ValueError):
    """The data cannot be trained on as the spec describes it. The message names
    the file, row and column where it can."""


@dataclass(frozen=True)
class Format:
    """How a row becomes a conversation (see the module doc)."""

    kind: str = "template"
    system: str = SYSTEM_MESSAGE
    prompt: str = TUTORIAL_PROMPT
    answer: str = _TEMPLATE_DEFAULTS["answer"]
    images: Tuple[str, ...] = tuple(_TEMPLATE_DEFAULTS["images"])
    image_placement: str = _TEMPLATE_DEFAULTS["imagePlacement"]
    messages_column: str = _MESSAGES_DEFAULTS["column"]
    images_column: str = _MESSAGES_DEFAULTS["imagesColumn"]

    @staticmethod
    def from_json(doc: Optional[Dict[str, Any]]) -> "Format":
        """The format from the job spec's dataset section (camelCase keys, as the
        Go side writes them); missing keys keep the tutorial's values."""
        if not doc:
            return TUTORIAL
        kind = doc.get("format", "template")
        if kind not in ("template", "messages"):
            raise DataError(f"dataset.format {kind!r} is not one of template, messages")
        t = doc.get("template") or {}
        m = doc.get("messages") or {}
        d = TUTORIAL
        fmt = Format(
            kind=kind,
            system=t.get("system", d.system),
            prompt=t.get("prompt", d.prompt),
            answer=t.get("answer", d.answer),
            images=tuple(t.get("images", d.images)),
            image_placement=t.get("imagePlacement", d.image_placement),
            messages_column=m.get("column", d.messages_column),
            images_column=m.get("imagesColumn", d.images_column),
        )
        if kind == "template":
            placeholders(fmt.prompt)  # raises on a malformed template
            if fmt.image_placement not in (IMAGES_AFTER, IMAGES_BEFORE):
                raise DataError(f"dataset.template.imagePlacement {fmt.image_placement!r} is not one of "
                                f"{IMAGES_AFTER}, {IMAGES_BEFORE}")
        return fmt

    def columns(self) -> List[str]:
        """The columns every row must have."""
        if self.kind == "messages":
            return [self.messages_column, self.images_column]
        cols = placeholders(self.prompt) + [self.answer] + list(self.images)
        return list(dict.fromkeys(cols))

    def image_columns(self) -> List[str]:
        return [self.images_column] if self.kind == "messages" else list(self.images)


TUTORIAL = Format()


def placeholders(template: str) -> List[str]:
    """The column names a prompt template refers to, in order, once each.
    ``{{`` and ``}}`` are literal braces; any other brace is an error."""
    names: List[str] = []
    for m in PLACEHOLDER_RE.finditer(template):
        tok = m.group(0)
        if tok in ("{{", "}}"):
            continue
        if m.group(1) is None:
            raise DataError(f"prompt template has a lone {tok!r} at character {m.start()}; write {tok * 2} for a literal brace")
        name = m.group(1)
        if not name.strip():
            raise DataError(f"prompt template has an empty placeholder at character {m.start()}")
        if name not in names:
            names.append(name)
    return names


def render(template: str, row: Dict[str, Any]) -> str:
    """The template with each {column} replaced by the row's value."""

    def sub(m: "re.Match[str]") -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        value = row[m.group(1)]
        return "" if value is None else str(value)

    return PLACEHOLDER_RE.sub(sub, template)


# ---------------------------------------------------------------------------
# Sources


def is_gs(path: str) -> bool:
    return path.startswith("gs://")


def _filesystem(path: str):
    """(pyarrow filesystem, path within it) for a local path or a URI."""
    import pyarrow.fs

    if "://" in path:
        return result.emulated_gcs(path) or pyarrow.fs.FileSystem.from_uri(path)
    return pyarrow.fs.LocalFileSystem(), os.path.abspath(path)


def _uri(root: str, fs_path: str) -> str:
    """A path inside root's filesystem as the user would write it."""
    if is_gs(root):
        return "gs://" + fs_path.lstrip("/")
    return fs_path


def _read(fs, fs_path: str) -> bytes:
    with fs.open_input_stream(fs_path) as f:
        return f.read()


def _list(fs, fs_path: str, recursive: bool = False) -> List[Tuple[str, bool]]:
    """[(path, is_file)] under a folder; empty if it does not exist."""
    import pyarrow.fs

    infos = fs.get_file_info(pyarrow.fs.FileSelector(fs_path, allow_not_found=True, recursive=recursive))
    return sorted((i.path, i.type == pyarrow.fs.FileType.File) for i in infos)


HUB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def is_hub_id(source: str) -> bool:
    """Whether source names a Hugging Face Hub dataset (owner/name), not a
    URI or a local path."""
    return bool(HUB_ID_RE.fullmatch(source)) and not os.path.exists(source)


def load_rows(source: str, split: str, fmt: Format = TUTORIAL, revision: str = ""):
    """The split's rows as a datasets.Dataset, images undecoded; raises DataError
    when a column the format needs is missing or the split is empty."""
    import datasets

    if is_hub_id(source):
        ds = _load_hub(source, split, revision)
        where = f"dataset {source!r} split {split!r}"
    elif not is_gs(source) and os.path.isdir(source) and any(
            os.path.exists(os.path.join(source, f)) for f in ("dataset_info.json", "dataset_dict.json")):
        ds = datasets.load_from_disk(source)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"dataset {source!r} has no split {split!r}; it has {sorted(ds)}")
            ds = ds[split]
        where = f"dataset {source!r} split {split!r}"
    else:
        ds, where = _load_files(source, split, fmt)
    # Images stay undecoded until a worker's collator takes the row.
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image) and feature.decode:
            ds = ds.cast_column(name, datasets.Image(decode=False))
        else:
            inner = feature[0] if isinstance(feature, list) and feature else getattr(feature, "feature", None)
            if isinstance(inner, datasets.Image) and inner.decode:
                ds = ds.cast_column(name, datasets.List(datasets.Image(decode=False)))
    if len(ds) == 0:
        raise DataError(f"{where} has no rows")
    missing = [c for c in fmt.columns() if c not in ds.column_names]
    if missing:
        said = ""
        if fmt.kind == "template":
            holes = [c for c in missing if c in placeholders(fmt.prompt)]
            if holes:
                said = f" (dataset.template.prompt has placeholder(s) {['{' + c + '}' for c in holes]})"
        raise DataError(f"{where} lacks column(s) {missing} that dataset.{_format_field(fmt)} names{said}; "
                        f"it has {[c for c in ds.column_names if c != '_source']}")
    return ds


def _load_hub(source: str, split: str, revision: str):
    """A Hub dataset's split; DataError when the Hub says the dataset, its revision or
    the split is not there, or that the token may not read it."""
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    try:
        return datasets.load_dataset(source, split=split, revision=revision or None)
    except DatasetNotFoundError as exc:
        raise DataError(f"{exc} (dataset.id {source!r}, dataset.revision {revision or 'the default branch'!r})") from None
    except ValueError as exc:
        if "Unknown split" not in str(exc):
            raise
        raise DataError(f"dataset {source!r} has no split {split!r} (dataset.split): {exc}") from None


def _format_field(fmt: Format) -> str:
    return "messages" if fmt.kind == "messages" else "template"


def _load_files(source: str, split: str, fmt: Format):
    """Rows from an ImageFolder layout or JSON Lines / Parquet files under source."""
    import datasets

    fs, root = _filesystem(source)
    root = root.rstrip("/")
    candidates = [posixpath.join(root, split)]
    if split == "train":
        candidates.append(root)
    for folder in candidates:
        listing = _list(fs, folder)
        files = {posixpath.basename(p): p for p, is_file in listing if is_file}
        for meta in METADATA_FILES:
            if meta in files:
                rows = _imagefolder_rows(fs, source, files[meta])
                return datasets.Dataset.from_list(_arrow_ready(rows, fmt)), _uri(source, files[meta])
        data_files = [p for p, is_file in listing if is_file and p.endswith(DATA_SUFFIXES)]
        if folder == root:
            # split-named files at the top: train.jsonl, train-00000.parquet, ...
            named = [p for p in data_files if posixpath.basename(p).startswith(split)]
            data_files = named or (data_files if split == "train" else [])
        if data_files:
            rows = []
            for p in data_files:
                rows.extend(_data_file_rows(fs, source, p, fmt))
            return datasets.Dataset.from_list(_arrow_ready(rows, fmt)), _uri(source, folder)
    tried = " or ".join(_uri(source, c) for c in candidates)
    raise DataError(f"no data for split {split!r} at {tried}: expected metadata.jsonl or metadata.csv beside the "
                    f"images (ImageFolder), or .jsonl / .parquet files")


def _imagefolder_rows(fs, source: str, meta_path: str) -> List[Dict[str, Any]]:
    folder = posixpath.dirname(meta_path)
    where = _uri(source, meta_path)
    raw = _read(fs, meta_path).decode("utf-8")
    if meta_path.endswith(".csv"):
        records = list(csv.DictReader(io.StringIO(raw)))
        lines = [i + 2 for i in range(len(records))]  # the header is line 1
    else:
        records, lines = _jsonl(raw, where)
    rows = []
    for rec, line in zip(records, lines):
        if FILE_NAME_COLUMN not in rec or not rec[FILE_NAME_COLUMN]:
            raise DataError(f"{where} line {line}: no {FILE_NAME_COLUMN!r} (ImageFolder names each row's image there)")
        rec = dict(rec)
        name = rec.pop(FILE_NAME_COLUMN)
        rec[IMAGEFOLDER_IMAGE_COLUMN] = {"path": _resolve(source, folder, name, where, line), "bytes": None}
        rec["_source"] = f"{where} line {line}"
        rows.append(rec)
    return rows


def _jsonl(raw: str, where: str) -> Tuple[List[Dict[str, Any]], List[int]]:
    records, lines = [], []
    for n, text in enumerate(raw.splitlines(), 1):
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where} line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{where} line {n}: a JSON object per line is expected, got {type(rec).__name__}")
        records.append(rec)
        lines.append(n)
    return records, lines


def _data_file_rows(fs, source: str, path: str, fmt: Format) -> List[Dict[str, Any]]:
    where = _uri(source, path)
    folder = posixpath.dirname(path)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fs.open_input_file(path) as f:
            records = pq.read_table(f).to_pylist()
        labels = [f"{where} row {i}" for i in range(len(records))]
    else:
        records, lines = _jsonl(_read(fs, path).decode("utf-8"), where)
        labels = [f"{where} line {n}" for n in lines]
    rows = []
    for rec, label in zip(records, labels):
        rec = dict(rec)
        for col in fmt.image_columns():
            if col not in rec:
                continue  # reported once for the whole split by load_rows
            value = rec[col]
            if fmt.kind == "messages" or isinstance(value, list):
                value = [] if value is None else value
                if not isinstance(value, list):
                    raise DataError(f"{label} column {col!r}: a list of images is expected, got {type(value).__name__}")
                rec[col] = [_image_ref(source, folder, v, label, col) for v in value]
            else:
                rec[col] = _image_ref(source, folder, value, label, col)
        rec["_source"] = label
        rows.append(rec)
    return rows


def _image_ref(source: str, folder: str, value: Any, label: str, col: str) -> Dict[str, Any]:
    """An image field as {"path", "bytes"} (datasets' undecoded Image): a path
    relative to the data file, a gs:// URI, a data: URI, or embedded bytes."""
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes"):
            return {"path": value.get("path"), "bytes": bytes(value["bytes"])}
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return {"path": None, "bytes": bytes(value)}
    if isinstance(value, str) and value:
        if value.startswith("data:"):
            try:
                return {"path": None, "bytes": base64.b64decode(value.split(",", 1)[1], validate=True)}
            except (ValueError, IndexError):
                raise DataError(f"{label} column {col!r}: a data: URI that is not base64") from None
        return {"path": _resolve(source, folder, value, label, None, col), "bytes": None}
    raise DataError(f"{label} column {col!r}: an image is a relative path, a gs:// URI or bytes, "
                    f"got {type(value).__name__}")


def _resolve(source: str, folder: str, name: str, where: str, line: Optional[int] = None, col: str = "") -> str:
    """A relative image path resolved against its data file's folder, kept inside source."""
    at = f"{where} line {line}" if line is not None else where
    if is_gs(name):
        return name
    if "://" in name or name.startswith("/"):
        raise DataError(f"{at}{' column ' + repr(col) if col else ''}: image {name!r} must be relative to the "
                        f"data file or a gs:// URI")
    joined = posixpath.normpath(posixpath.join(folder, name))
    _, root = _filesystem(source)
    if not (joined + "/").startswith(root.rstrip("/") + "/"):
        raise DataError(f"{at}: image {name!r} points outside {source}")
    return _uri(source, joined)


def _arrow_ready(rows: List[Dict[str, Any]], fmt: Format) -> List[Dict[str, Any]]:
    """Rows whose nested values Arrow can hold in one column: a messages column
    is kept as JSON text (its parts mix strings and lists)."""
    if fmt.kind != "messages":
        return rows
    out = []
    for r in rows:
        r = dict(r)
        if fmt.messages_column in r and not isinstance(r[fmt.messages_column], str):
            r[fmt.messages_column] = json.dumps(r[fmt.messages_column], ensure_ascii=False)
        out.append(r)
    return out


def iter_rows(dataset, lo: int = 0, hi: Optional[int] = None, batch: int = 256):
    """(index, row) for rows [lo, hi) of a datasets.Dataset, the rows as
    dataset[i] gives them, read a slice at a time (one Arrow read per slice
    instead of one per row)."""
    hi = len(dataset) if hi is None else hi
    for start in range(lo, hi, batch):
        cols = dataset[start:min(hi, start + batch)]
        names = list(cols)
        for k, values in enumerate(zip(*(cols[n] for n in names))):
            yield start + k, dict(zip(names, values))


def hold_out(dataset, share: float, seed: int):
    """(train, eval): share of the rows (at least one, and at least one left
    to train on) drawn with seed; eval is None when share is 0."""
    if share <= 0:
        return dataset, None
    n = len(dataset)
    if n < 2:
        raise DataError(f"cannot hold out rows for evaluation from a dataset of {n} row(s); set dataset.evalShare to 0")
    size = min(max(1, round(n * share)), n - 1)
    parts = dataset.train_test_split(test_size=size, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


# ---------------------------------------------------------------------------
# Conversations


def row_label(row: Dict[str, Any], index: Optional[int] = None) -> str:
    """Where a row came from, for messages: its file and line when known."""
    if row.get("_source"):
        return str(row["_source"])
    return f"row {index}" if index is not None else "a row"


def conversation(row: Dict[str, Any], fmt: Format = TUTORIAL, with_answer: bool = True) -> List[Dict[str, Any]]:
    """The row as chat-template messages, images as {"type": "image"} parts.
    with_answer=False leaves out the last assistant turn (what a model answers)."""
    if fmt.kind == "messages":
        msgs = _messages_of(row, fmt)
        if not with_answer:
            last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=len(msgs))
            msgs = msgs[:last]
        return msgs
    text = {"type": "text", "text": render(fmt.prompt, row)}
    images = [{"type": "image"} for _ in range(len(_row_images(row, fmt)))]
    user = images + [text] if fmt.image_placement == IMAGES_BEFORE else [text] + images
    msgs: List[Dict[str, Any]] = []
    if fmt.system:
        msgs.append({"role": "system", "content": [{"type": "text", "text": fmt.system}]})
    msgs.append({"role": "user", "content": user})
    if with_answer:
        answer = row[fmt.answer]
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": "" if answer is None else str(answer)}]})
    return msgs


def messages(row: Dict[str, Any], with_answer: bool = True, fmt: Format = TUTORIAL) -> List[Dict[str, Any]]:
    """The conversation for one row (the tutorial's format unless fmt says otherwise)."""
    return conversation(row, fmt, with_answer)


def _messages_of(row: Dict[str, Any], fmt: Format) -> List[Dict[str, Any]]:
    raw = row[fmt.messages_column]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise DataError(f"column {fmt.messages_column!r} is not a JSON list of messages") from None
    if not isinstance(raw, list) or not raw:
        raise DataError(f"column {fmt.messages_column!r}: a non-empty list of messages is expected")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise DataError(f"column {fmt.messages_column!r} message {i}: role must be system, user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = []
            for p in content:
                kind = p.get("type") if isinstance(p, dict) else None
                if kind == "image":
                    parts.append({"type": "image"})
                elif kind == "text" and isinstance(p.get("text"), str):
                    parts.append({"type": "text", "text": p["text"]})
                else:
                    raise DataError(f"column {fmt.messages_column!r} message {i}: a content part is "
                                    f"{{\"type\": \"text\", \"text\": ...}} or {{\"type\": \"image\"}}")
        else:
            raise DataError(f"column {fmt.messages_column!r} message {i}: content must be text or a list of parts")
        if m["role"] == "assistant" and any(p["type"] == "image" for p in parts):
            raise DataError(f"column {fmt.messages_column!r} message {i}: an assistant turn cannot hold an image")
        out.append({"role": m["role"], "content": parts})
    return out


def _row_images(row: Dict[str, Any], fmt: Format) -> List[Any]:
    """The row's image references, in placeholder order."""
    out: List[Any] = []
    for col in fmt.image_columns():
        value = row[col]
        if isinstance(value, list):
            out.extend(value)
        elif value is not None:
            out.append(value)
    return out


def row_images(row: Dict[str, Any], fmt: Format = TUTORIAL) -> List[Any]:
    return _row_images(row, fmt)


# ---------------------------------------------------------------------------
# Encoding


def segments(processor, msgs: List[Dict[str, Any]]) -> List[Tuple[str, bool]]:
    """The rendered conversation as [(text, is_target)]: each assistant turn's
    answer (and its end-of-turn marker) is a target, the rest is not. Every
    prefix is rendered by the chat template itself, so the split is exact."""

    def render_msgs(part, gen):
        return processor.apply_chat_template(part, add_generation_prompt=gen, tokenize=False)

    out: List[Tuple[str, bool]] = []
    done = ""
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = render_msgs(msgs[:i], True)
        full = render_msgs(msgs[: i + 1], False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise DataError("chat template does not render the conversation's turns as prefixes of each other")
        out.append((prompt[len(done):], False))
        out.append((full[len(prompt):], True))
        done = full
    whole = render_msgs(msgs, False) if msgs and msgs[-1]["role"] != "assistant" else done
    if not whole.startswith(done):
        raise DataError("chat template does not render the conversation's turns as prefixes of each other")
    if whole[len(done):]:
        out.append((whole[len(done):], False))
    return out


def prompt_and_completion(processor, row: Dict[str, Any], fmt: Format = TUTORIAL) -> Tuple[str, str]:
    """The text up to the last answer, and the last answer (with its end marker)."""
    segs = segments(processor, conversation(row, fmt))
    last = max((i for i, (_, t) in enumerate(segs) if t), default=None)
    if last is None:
        return "".join(t for t, _ in segs), ""
    return "".join(t for t, _ in segs[:last]), segs[last][0]


def _expanded(processor, text: str) -> str:
    """The text as Gemma3Processor gives it to the tokenizer: every
    <start_of_image> becomes "\n\n<boi><image>*N<eoi>\n\n"."""
    return text.replace(processor.boi_token, processor.full_image_sequence)


def _tokens_reference(processor, text: str, expand_images: bool) -> List[int]:
    """The ids of a segment, the image blocks expanded in the text first: the
    definition _tokens must agree with (tests compare the two)."""
    if expand_images:
        text = _expanded(processor, text)
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


class _ImageBlock:
    """Splices each image's run of soft tokens in as ids instead of tokenizing it.

    The run (processor.image_seq_length <image_soft_token>s) sits between two
    special tokens, <start_of_image> and <end_of_image>, and the tokenizer
    splits its input at special tokens before anything else, so the run's
    ids do not depend on the text around it; tokenizing 256 special tokens
    per image is most of a row's tokenizer time. ``ok`` is False (and the
    caller expands the text instead) unless the processor's image sequence
    has that shape and a probe of awkward contexts encodes identically both
    ways.
    """

    PROBES = ("{boi}", "a{boi}b", "{boi}{boi}", " {boi} ", "\n{boi}\n", "x\n\n{boi}\n\ny", "{boi}<end_of_turn>\n",
              "{image}{boi}{eoi}")

    def __init__(self, processor):
        self.ok = False
        tok = processor.tokenizer
        boi, image, n = processor.boi_token, getattr(processor, "image_token", None), processor.image_seq_length
        full = getattr(processor, "full_image_sequence", None)
        if not (boi and image and n and full) or full.count(image * n) != 1:
            return
        at = full.index(image * n)
        head, tail = full[:at], full[at + len(image) * n:]
        special = set(tok.all_special_tokens) | {t.content for t in tok.added_tokens_decoder.values() if t.special}
        if not head.endswith(boi) or not tail or full.count(boi) != 1 or not {boi, image} <= special:
            return
        # The special token right after the run keeps it apart from the text after.
        if not any(tail.startswith(t) for t in special):
            return
        self.boi_id = tok.convert_tokens_to_ids(boi)
        self.run = [tok.convert_tokens_to_ids(image)] * n
        self.compact = head + tail
        self.boi = boi
        eoi = tail[:max(len(t) for t in special if tail.startswith(t))]
        self.ok = all(self.ids(tok, p.format(boi=boi, image=image, eoi=eoi)) ==
                      _tokens_reference(processor, p.format(boi=boi, image=image, eoi=eoi), True) for p in self.PROBES)

    def ids(self, tok, text: str) -> List[int]:
        ids = tok(text.replace(self.boi, self.compact), add_special_tokens=False)["input_ids"]
        return self.splice(ids)

    def splice(self, ids: List[int]) -> List[int]:
        if self.boi_id not in ids:
            return ids
        out: List[int] = []
        for t in ids:
            out.append(t)
            if t == self.boi_id:
                out.extend(self.run)
        return out


_IMAGE_BLOCKS: Dict[int, Tuple[Any, _ImageBlock]] = {}


def _image_block(processor) -> _ImageBlock:
    got = _IMAGE_BLOCKS.get(id(processor))
    if got is None or got[0] is not processor:
        got = (processor, _ImageBlock(processor))
        _IMAGE_BLOCKS[id(processor)] = got
    return got[1]


def _tokens(processor, text: str, expand_images: bool) -> List[int]:
    return _segment_ids(processor, [(text, not expand_images)])[0]


def _segment_ids(processor, segs: Sequence[Tuple[str, bool]]) -> List[List[int]]:
    """The ids of each (text, is_target) segment, as _tokens_reference gives
    them: image blocks are expanded in the segments that are not targets,
    and the chat template already starts with <bos>, so the tokenizer adds
    no special tokens of its own. One tokenizer call for all of them."""
    if not segs:
        return []
    block = _image_block(processor)
    boi = processor.boi_token
    texts = []
    for text, is_target in segs:
        if not is_target and boi in text:
            text = text.replace(boi, block.compact) if block.ok else _expanded(processor, text)
        texts.append(text)
    out = processor.tokenizer(texts, add_special_tokens=False)["input_ids"]
    if block.ok:
        out = [ids if is_target else block.splice(ids) for ids, (_, is_target) in zip(out, segs)]
    return out


def encode(processor, row: Dict[str, Any], fmt: Format = TUTORIAL) -> Tuple[List[int], List[bool]]:
    """(token ids, is-target per token) of one row: what training learns from,
    the length filter measures and the data check counts."""
    segs = segments(processor, conversation(row, fmt))
    ids: List[int] = []
    target: List[bool] = []
    for toks, (_, is_target) in zip(_segment_ids(processor, segs), segs):
        ids.extend(toks)
        target.extend([is_target] * len(toks))
    return ids, target


def encode_reference(processor, row: Dict[str, Any], fmt: Format = TUTORIAL) -> Tuple[List[int], List[bool]]:
    """encode, one tokenizer call per segment with the image blocks expanded
    in the text, as Gemma3Processor does: the definition encode is tested
    against."""
    ids: List[int] = []
    target: List[bool] = []
    for text, is_target in segments(processor, conversation(row, fmt)):
        toks = _tokens_reference(processor, text, expand_images=not is_target)
        ids.extend(toks)
        target.extend([is_target] * len(toks))
    return ids, target


def encode_text(processor, row: Dict[str, Any], fmt: Format = TUTORIAL) -> Tuple[List[int], List[int]]:
    """Token ids of the prompt (image placeholders expanded) and of the last answer."""
    prompt, completion = prompt_and_completion(processor, row, fmt)
    return _tokens(processor, prompt, True), _tokens(processor, completion, False)


def sequence_lengths(processor, dataset, fmt: Format = TUTORIAL) -> List[int]:
    """Exact token count of every row (no image is decoded)."""
    text_only = dataset.select_columns([c for c in fmt.columns() if c not in fmt.image_columns()]
                                       + fmt.image_columns())
    return [len(encode(processor, row, fmt)[0]) for row in text_only]


def has_answer(row: Dict[str, Any], fmt: Format = TUTORIAL) -> bool:
    """Whether the row has an answer to learn: a non-blank answer column
    (template), or an assistant turn with text (messages)."""
    if fmt.kind == "messages":
        return any(m["role"] == "assistant" and any(p["type"] == "text" and p["text"].strip() for p in m["content"])
                   for m in _messages_of(row, fmt))
    value = row[fmt.answer]
    return value is not None and str(value).strip() != ""


def filter_by_length(dataset, processor, max_length: int, fmt: Format = TUTORIAL):
    """Leave out rows longer than max_length, and rows with no answer.

    Truncating a vision-language sample could cut through the image's token
    block (the model then fails on a token/feature count mismatch) or drop the
    whole answer, so over-long rows are skipped instead, and counted; a row
    with a blank answer has nothing to learn. The data check leaves out the
    same rows (datacheck.py).
    Returns (dataset, number of rows left out, the longest row's length).
    """
    text_only = dataset.select_columns([c for c in fmt.columns() if c not in fmt.image_columns()]
                                       + fmt.image_columns())
    lengths, keep = [], []
    for i, row in enumerate(text_only):
        n = len(encode(processor, row, fmt)[0])
        lengths.append(n)
        if n <= max_length and has_answer(row, fmt):
            keep.append(i)
    longest = max(lengths) if lengths else 0
    if not keep:
        raise DataError(
            f"no row can be trained on: every row is longer than --max-seq-length {max_length} (shortest "
            f"{min(lengths) if lengths else 0}) or has a blank answer"
        )
    dropped = len(lengths) - len(keep)
    if dropped:
        dataset = dataset.select(keep)
    return dataset, dropped, longest


def open_image(ref: Any):
    """A PIL image from a row's image value: a PIL image, {"path", "bytes"}, or
    bytes. Paths may be local or gs:// (read through pyarrow's filesystem)."""
    from PIL import Image

    if hasattr(ref, "convert"):
        return ref
    if isinstance(ref, dict):
        if ref.get("bytes"):
            return Image.open(io.BytesIO(ref["bytes"]))
        path = ref.get("path")
        if not path:
            raise DataError("an image with neither bytes nor a path")
        if "://" not in path:
            # A local file: read directly, which is several times faster than
            # through pyarrow's filesystem for a file this size.
            with open(path, "rb") as f:
                return Image.open(io.BytesIO(f.read()))
        fs, p = _filesystem(path)
        return Image.open(io.BytesIO(_read(fs, p)))
    if isinstance(ref, (bytes, bytearray)):
        return Image.open(io.BytesIO(bytes(ref)))
    raise DataError(f"not an image: {type(ref).__name__}")


def image_name(ref: Any) -> str:
    if isinstance(ref, dict) and ref.get("path"):
        return str(ref["path"])
    return "embedded image"


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

    completion_only=True: labels are the assistants' answers (and their
    end-of-turn markers) only. False: every token but padding,
    <start_of_image> and the image soft tokens, as in the reference tutorial.
    A row may carry any number of images, none included; the batch's
    pixel_values hold them in order (None when the batch has none).
    """

    def __init__(self, processor, completion_only: bool = True, pad_to_multiple_of: Optional[int] = None,
                 fmt: Format = TUTORIAL):
        tok = processor.tokenizer
        self.processor = processor
        self.fmt = fmt
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
            ids, target = encode(self.processor, row, self.fmt)
            if self.completion_only:
                labels = [t if is_t else IGNORE_INDEX for t, is_t in zip(ids, target)]
            else:
                labels = [
                    IGNORE_INDEX if t in (self.pad_id, self.boi_token_id, self.image_token_id) else t for t in ids
                ]
            # Position 0 is never a target after the shift; masking it keeps the
            # Trainer's count of loss tokens equal to the tokens really scored.
            labels[0] = IGNORE_INDEX
            row_imgs = _row_images(row, self.fmt)
            n_img = sum(1 for t in ids if t == self.image_token_id)
            if n_img != self.image_seq_length * len(row_imgs):
                raise DataError(f"{row_label(row)}: {n_img} image tokens for {len(row_imgs)} image(s), expected "
                                f"{self.image_seq_length} per image")
            ids_list.append(ids)
            labels_list.append(labels)
            images.extend(open_image(r).convert("RGB") for r in row_imgs)

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
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "labels": labels,
        }
        if images:
            batch["pixel_values"] = self.processor.image_processor(images, return_tensors="pt")["pixel_values"]
        positions, targets = label_positions(labels)
        batch["label_positions"] = positions
        batch["label_targets"] = targets
        return batch


# Kept for the callers that name the tutorial's columns.
TEXT_COLUMNS = ("Product Name", "Category", "description")
IMAGE_COLUMN = "image"
USER_PROMPT = TUTORIAL_PROMPT.replace("{Product Name}", "{product}").replace("{Category}", "{category}")
