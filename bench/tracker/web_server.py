"""`manage.py runserver` for the scripts that photograph or time pages in Chromium (bench/tracker/metrics.py,
bench/tracker/generations_render.py, docs/tools/screenshot.py): started, waited for until /login/ answers, and
stopped with its children however the block ends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def runserver(*, port: int, env: dict[str, str] | None = None, timeout_s: float = 60) -> Iterator[str]:
    """Yields the server's base URL once /login/ answers. Raises RuntimeError if the server exits first or
    does not answer within `timeout_s`: a page timed or photographed against no server measures nothing."""
    log = tempfile.TemporaryFile()  # not a pipe: its request lines would fill one and stop the server
    server = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)  # its own group: runserver's children go with it
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(base + "/login/", timeout=2)
                break
            except urllib.error.HTTPError:  # it answered, if not with 200: it is up
                break
            except OSError:
                if server.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"runserver exited ({server.returncode}):\n{log.read().decode()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"runserver did not answer {base}/login/ within {timeout_s:.0f} s")
                time.sleep(0.5)
        yield base
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
