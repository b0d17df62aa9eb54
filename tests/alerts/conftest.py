"""A real webhook receiver (an HTTP server thread on 127.0.0.1) and a launched run to alert about."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig


class Receiver:
    """What the server was sent: each POST's path and JSON body, and the status it answered. `fail_next`
    answers that many of the next requests with a 500."""

    def __init__(self):
        self.requests: list[dict] = []
        self.fail_next = 0
        self.lock = threading.Lock()
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/team"

    def bodies(self, status: int = 200) -> list[dict]:
        with self.lock:
            return [r["body"] for r in self.requests if r["status"] == status]


def _handler(receiver: Receiver):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with receiver.lock:
                status = 500 if receiver.fail_next else 200
                receiver.fail_next = max(0, receiver.fail_next - 1)
                receiver.requests.append({"path": self.path, "body": body, "status": status,
                                          "content_type": self.headers["Content-Type"]})
            answer = b"ok" if status == 200 else b"receiver down for a moment"
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def receiver(settings):
    """The receiver, its address allowed as a webhook host (EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS)."""
    found = Receiver()
    found.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(found))
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    yield found
    found.server.shutdown()
    found.server.server_close()


@pytest.fixture
def run(user, roots):
    user.email = "launcher@example.com"
    user.save(update_fields=["email"])
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(), name="alerted run", enqueue=False)


from tests.browser.conftest import page  # noqa: E402,F401 - Chromium, for the bell's browser test
