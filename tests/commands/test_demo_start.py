"""`make demo`'s first start: the build says how far it is, the login is printed last, once the server answers."""
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core.management import CommandError, call_command

from runs.management.commands.build_demo_assets import BuildProgress

pytestmark = pytest.mark.django_db


def test_build_progress_shows_the_step_and_an_estimate():
    out = io.StringIO()
    progress = BuildProgress(out, interval=0)
    progress.started -= 10  # ten seconds in, a quarter done: about thirty left
    progress(25, 100)
    progress(100, 100)
    progress.done()
    text = out.getvalue()
    assert "step 25 of 100, about 30 s left" in text
    assert "step 100 of 100" in text and "Demo target ready in" in text


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(302)
        self.send_header("Location", "/accounts/login/")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_login_is_printed_once_the_server_answers(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    server = HTTPServer(("127.0.0.1", 0), _Slow)
    port = server.server_address[1]
    server.server_close()  # nothing listens yet: the command must wait
    answering = HTTPServer(("127.0.0.1", port), _Slow)

    def start_later():
        time.sleep(1.0)
        answering.serve_forever()

    threading.Thread(target=start_later, daemon=True).start()
    out = io.StringIO()
    started = time.monotonic()
    call_command("demo_login", wait_for=f"http://127.0.0.1:{port}/", timeout=30, stdout=out)
    answering.shutdown()
    assert time.monotonic() - started >= 0.9
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines[0] == f"eagle3web is up: http://127.0.0.1:{port}/"
    assert lines[1].startswith("Log in as: demo / ")


def test_a_server_that_never_answers_is_named(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    server = HTTPServer(("127.0.0.1", 0), _Slow)
    port = server.server_address[1]
    server.server_close()
    with pytest.raises(CommandError, match=f"did not answer at http://127.0.0.1:{port}/ within 1 s"):
        call_command("demo_login", wait_for=f"http://127.0.0.1:{port}/", timeout=1, stdout=io.StringIO())
