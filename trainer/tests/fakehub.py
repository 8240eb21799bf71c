"""A fake Hugging Face Hub serving one model repository at one commit from a local
folder, over the endpoints huggingface_hub's HfFileSystem reads (huggingface_hub
0.36): the revision's info, its tree, and the files (with Range requests). It counts
the file GETs, so a test can say how often each file was read."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict
from urllib.parse import unquote, urlsplit

REPO = "google/gemma-3-4b-it"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# What a real repository holds beside the model, none of which a model load reads.
EXTRA_FILES = {
    "README.md": b"# a model card\n",
    ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    "pytorch_model.bin": b"pickled weights the safetensors make unnecessary",
    "original/consolidated.00.pth": b"the authors' own checkpoint format",
}


class FakeHub:
    """The Hub at url, serving repo at commit (or "main") with files: path -> bytes."""

    def __init__(self, files: Dict[str, bytes], repo: str = REPO, commit: str = COMMIT) -> None:
        self.files, self.repo, self.commit = dict(files), repo, commit
        self.gets: collections.Counter = collections.Counter()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                hub._serve(self)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @classmethod
    def of_folder(cls, folder: str, extra: Dict[str, bytes] = EXTRA_FILES) -> "FakeHub":
        files = {}
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                files[name] = f.read()
        files.update(extra)
        return cls(files)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        path = unquote(urlsplit(req.path).path)
        r = re.escape(self.repo)
        for pattern, handler in (
            (rf"^/api/models/{r}/revision/(?P<rev>[^/]+)$", self._info),
            (rf"^/api/models/{r}/tree/(?P<rev>[^/]+)(?:/(?P<dir>.*))?$", self._tree),
            (rf"^/{r}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", self._file),
        ):
            m = re.match(pattern, path)
            if m:
                if m.group("rev") not in (self.commit, "main"):
                    return _error(req, 404, "RevisionNotFound")
                return handler(req, m)
        _error(req, 404, "RepoNotFound")

    def _info(self, req, m) -> None:
        _json(req, {"id": self.repo, "sha": self.commit, "siblings": [{"rfilename": p} for p in sorted(self.files)]})

    def _tree(self, req, m) -> None:
        folder = (m.group("dir") or "").strip("/")
        prefix = folder + "/" if folder else ""
        entries, dirs = [], set()
        for p, body in sorted(self.files.items()):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if "/" in rest:
                dirs.add(prefix + rest.split("/", 1)[0])
            else:
                entries.append({"type": "file", "path": p, "size": len(body),
                                "oid": hashlib.sha1(body).hexdigest()})
        entries += [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()} for d in sorted(dirs)]
        _json(req, entries)

    def _file(self, req, m) -> None:
        name = m.group("file")
        body = self.files.get(name)
        if body is None:
            return _error(req, 404, "EntryNotFound")
        self.gets[name] += 1
        status, start, end = 200, 0, len(body)
        rng = re.match(r"^bytes=(\d+)-(\d*)$", req.headers.get("Range", ""))
        if rng:
            start = int(rng.group(1))
            end = min(int(rng.group(2)) + 1, len(body)) if rng.group(2) else len(body)
            status = 206
        req.send_response(status)
        req.send_header("Content-Length", str(end - start))
        req.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
        req.send_header("X-Repo-Commit", self.commit)
        if status == 206:
            req.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        req.end_headers()
        req.wfile.write(body[start:end])


def _json(req: BaseHTTPRequestHandler, doc) -> None:
    body = json.dumps(doc).encode("utf-8")
    req.send_response(200)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


def _error(req: BaseHTTPRequestHandler, status: int, code: str) -> None:
    body = json.dumps({"error": code}).encode("utf-8")
    req.send_response(status)
    req.send_header("X-Error-Code", code)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)
