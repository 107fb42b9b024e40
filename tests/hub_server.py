"""A model repository served over HTTP as the Hugging Face Hub serves one, on 127.0.0.1: the API routes and headers
huggingface_hub's own client reads (model info, revision, tree; HEAD and GET of /resolve/ with X-Repo-Commit, ETag
and byte ranges), so that its real download code runs here without a network (HF_ENDPOINT points at it). A file
can be served slowly, to interrupt a download in the middle."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"


class FakeHub:
    """One repository `repo` holding `files` (path -> bytes); `slow` paths are sent at `rate` bytes a second."""

    def __init__(self, repo: str, files: dict[str, bytes], slow: tuple[str, ...] = (), rate: int = 4096):
        self.repo, self.files, self.slow, self.rate = repo, files, slow, rate
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header) as asked
        self.sent: dict[str, int] = {}  # bytes of each file's body sent so far
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
                hub._answer(self, body=False)

            def do_GET(self) -> None:  # noqa: N802
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _entry(self, path: str) -> dict:
        data = self.files[path]
        entry = {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
        if path.endswith(".safetensors"):  # stored in LFS on the hub: its ETag is the content's sha256
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range", "")))
        api = re.fullmatch(rf"/api/models/{re.escape(self.repo)}(?:/revision/[^/]+)?", path)
        tree = re.fullmatch(rf"/api/models/{re.escape(self.repo)}/tree/[^/]+(?:/.*)?", path)
        resolve = re.fullmatch(rf"/{re.escape(self.repo)}/resolve/[^/]+/(.+)", path)
        if api or tree:
            entries = [self._entry(p) for p in sorted(self.files)]
            doc: object = entries if tree else {
                "id": self.repo, "modelId": self.repo, "sha": COMMIT, "private": False, "disabled": False,
                "siblings": [{"rfilename": e["path"], "size": e["size"], "blobId": e["oid"],
                              **({"lfs": {"sha256": e["lfs"]["oid"], "size": e["size"], "pointerSize": 134}}
                                 if "lfs" in e else {})} for e in entries]}
            self._send(h, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, body)
        elif resolve and resolve.group(1) in self.files:
            name = resolve.group(1)
            data, entry = self.files[name], self._entry(name)
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            start = 0
            if body and (rng := re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", ""))):
                start = int(rng.group(1))
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(h, 206 if start else 200, data[start:], headers, body, slow=name in self.slow, name=name)
        else:
            self._send(h, 404, b'{"error": "Repository not found"}',
                       {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, body)

    def _send(self, h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool,
              slow: bool = False, name: str = "") -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not body:
            return
        step = max(1, self.rate // 10) if slow else len(data) or 1
        try:
            for i in range(0, len(data), step):
                h.wfile.write(data[i:i + step])
                self.sent[name] = self.sent.get(name, 0) + len(data[i:i + step])
                if slow:
                    time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):  # the client went away (an interrupted download)
            pass
