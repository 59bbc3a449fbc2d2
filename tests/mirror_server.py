"""A local HTTP server for a directory in Wikimedia's dump layout (127.0.0.1, a thread), with
range requests, directory index pages, a log of the requests, a way to cut a response short
(a download killed half-way) and, optionally, HTTP basic auth (a mirror that needs a login)."""
from __future__ import annotations

import base64
import contextlib
import http.server
import threading
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        server = self.server
        rel = unquote(self.path.split("?", 1)[0]).lstrip("/")
        path = Path(server.root) / rel
        server.requests.append((rel, self.headers.get("Range")))
        if server.auth is not None:
            want = "Basic " + base64.b64encode(":".join(server.auth).encode()).decode()
            if self.headers.get("Authorization") != want:
                server.refused += 1
                return self._send(401, b"login required", "text/plain", extra={"WWW-Authenticate": 'Basic realm="dumps"'})
        if path.is_dir():
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
            body = "".join(f'<a href="{n}">{n}</a>\n' for n in names).encode()
            return self._send(200, body, "text/html")
        if not path.is_file():
            return self._send(404, b"not found", "text/plain")
        data = path.read_bytes()
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and server.ranges:
            start = int(rng.split("=", 1)[1].split("-", 1)[0])
            if start >= len(data):
                return self._send(416, b"", "text/plain")
            status = 206
        cut = server.cut.pop(rel, None)
        self._send(status, data[start:], "application/octet-stream", cut=cut,
                   extra={"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if status == 206 else None)

    def _send(self, status: int, body: bytes, ctype: str, cut: int | None = None, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if cut is not None:   # send part of the body, then drop the connection
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@contextlib.contextmanager
def serve(root: Path, ranges: bool = True, auth: tuple[str, str] | None = None) -> Iterator[http.server.ThreadingHTTPServer]:
    """Serve ``root``; the server has ``.url``, ``.requests`` [(path, Range header)], ``.cut``
    {path: bytes to send before dropping the connection, once} and ``.ranges`` (honour Range).
    With ``auth`` (user, password), a request without that basic-auth login gets 401 (counted
    in ``.refused``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.root, server.requests, server.cut, server.ranges = str(root), [], {}, ranges
    server.auth, server.refused = auth, 0
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
