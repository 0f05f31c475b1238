"""A model hub on loopback that answers ``huggingface_hub`` downloads, for the tests of taking
models from their official repositories (``pipelines/models/hub.py``) where no hub can be reached.

It serves ``GET``/``HEAD /{repo}/resolve/{revision}/{file}`` as the Hugging Face hub does for a
plain (non-Xet) file: the bytes, with ``ETag``, ``X-Repo-Commit`` and ``Content-Length``; anything
else is a 404. Point a process at it with ``HF_ENDPOINT`` (read when huggingface_hub is imported).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMMIT = "c0ffee" * 6 + "c0ff"  # 40 hex digits


@contextmanager
def fake_hub(files: dict[tuple[str, str], bytes | Path]) -> Iterator[tuple[str, list[str]]]:
    """``files``: (repo, file path) -> its bytes or a file holding them. Yields the endpoint URL and
    the list of request paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _body(self) -> bytes | None:
            path = self.path.split("?")[0].strip("/").split("/")
            if len(path) < 5 or path[2] != "resolve":
                return None
            found = files.get(("/".join(path[:2]), "/".join(path[4:])))
            return found.read_bytes() if isinstance(found, Path) else found

        def _answer(self, with_body: bool) -> None:
            asked.append(self.path)
            body = self._body()
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(True)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", asked
    finally:
        server.shutdown()
        server.server_close()
