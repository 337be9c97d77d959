"""An HTTP proxy before a test's S3 server, which a test bends: it may
hold a request before forwarding it, answer it itself, read its body
slowly, or hold an answer's body part way."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


def payload_object(path: str) -> str | None:
    """The object a request's ``path`` names when it is a payload's (its
    query dropped), else ``None``."""
    path = path.split("?")[0]
    return path if path.endswith("/payload") else None


class S3Proxy:
    """Forwards every request to ``upstream`` and its answer back.
    Subclasses override :meth:`before` and :meth:`body`."""

    def __init__(self, upstream: str):
        up = urlsplit(upstream)
        self.lock = threading.Lock()
        proxy = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                own = proxy.before(self.command, self.path)
                if own is not None:
                    self._answer(*own)
                    return
                assert "chunked" not in self.headers.get("Transfer-Encoding", ""), self.headers
                body = proxy.body(self.rfile, int(self.headers.get("Content-Length", "0")))
                c = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
                c.request(self.command, self.path, body=body or None, headers=dict(self.headers))
                r = c.getresponse()
                answer = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if self.command != "HEAD":
                    proxy.reply(self.command, self.path, self.wfile, answer)
                c.close()

            def _answer(self, status: int, body: bytes):
                # The request's body is left unread: the connection ends.
                self.close_connection = True
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def before(self, method: str, path: str) -> tuple[int, bytes] | None:
        """Runs before a request is forwarded (on its own thread); an
        answer (status, XML body) it returns is sent instead."""
        return None

    def body(self, rfile, length: int) -> bytes:
        """A request's body of ``length`` bytes."""
        return rfile.read(length)

    def reply(self, method: str, path: str, wfile, answer: bytes) -> None:
        """Writes the upstream's answer body (its headers are sent)."""
        wfile.write(answer)

    def close(self):
        self.server.shutdown()
