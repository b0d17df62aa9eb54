"""The client against a real server: pytest-django's live_server, tokens from the API's own service, and a
real HTTP proxy in front of it that can lose an answer (the request reached the server, the connection
was then closed) or answer 503, to show what the client sends again and what it does not."""
from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from runs.api import tokens
from tests.api.conftest import make_user


@pytest.fixture(autouse=True)
def auth_failures_cleared():
    """Failed attempts are counted per address for a minute, in Redis: one test's are not the next's."""
    tokens.auth_failures_clear(client="127.0.0.1")
    yield
    tokens.auth_failures_clear(client="127.0.0.1")


@pytest.fixture
def launcher_token(transactional_db):
    user = make_user("cluster-bot", "launcher")
    return tokens.token_create(user=user, name="client tests")[1]


class FaultyProxy:
    """Forwards every request to `upstream`; `faults` is a list of (method, path prefix, fault) taken in
    order, fault "drop" (forwarded, then the connection closed with no answer) or "503" (answered 503,
    not forwarded). `seen` lists every (method, path, what happened)."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream).netloc
        self.faults: list[tuple[str, str, str]] = []
        self.seen: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy._take(self.command, self.path)
                if fault in ("503", "429"):
                    proxy.seen.append((self.command, self.path, fault))
                    data = b'{"error": "the proxy says: try again", "fields": {}}'
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                upstream = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                upstream.close()
                if fault == "drop":
                    proxy.seen.append((self.command, self.path, f"dropped {answer.status}"))
                    self.close_connection = True
                    return
                proxy.seen.append((self.command, self.path, str(answer.status)))
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _take(self, method: str, path: str) -> str | None:
        for i, (m, prefix, fault) in enumerate(self.faults):
            if m == method and path.startswith(prefix):
                del self.faults[i]
                return fault
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(live_server):
    p = FaultyProxy(live_server.url)
    yield p
    p.close()
