"""The embedded SQLite (`make demo`'s database) with several writers at once: two real Celery
workers and the web server, each a process of its own, on one database file.

One worker catalogues a chat file in batches while the other verifies extractions (start, progress,
result) and the web server answers signed-in users pressing "Verify now" and writing reviews, which
hand jobs to the workers after commit. Every request must be answered without a 500, every job must
succeed in its first attempt, and every row must arrive: the catalogue holds each conversation of
the file once, each review posted is stored, each verification asked for is done.

This test does not use the tests' PostgreSQL: the processes it starts get DATABASE_URL=sqlite:///...
and it counts rows in that file itself (sqlite3, read only)."""
from __future__ import annotations

import http.cookiejar
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from django.conf import settings

from tests.helpers.outage import free_port, wait_for_port
from tests.helpers.worker import BASE_DIR, celery_worker

pytestmark = pytest.mark.slow

CHATS = 60_000  # the catalogue's batches (2,000 each) span the whole web load
EXTRACTIONS = 3
USERS = 3  # signed-in users posting at once, each from a thread of its own
MIN_SECONDS = 20  # the web load lasts at least this long, and until the catalogue is done


def sqlite_env(db: Path, data_dir: Path) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "EAGLE3WEB_DATA_DIR": str(data_dir), "EAGLE3WEB_DATA_ROOTS": str(data_dir),
            "EAGLE3WEB_RUNS_DIR": str(data_dir / "runs"), "EAGLE3WEB_PROGRESS_INTERVAL": "1",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def web_server(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`manage.py runserver` (threaded, as `make demo` starts it) on the test's database file."""
    port = free_port()
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                                env=env, cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_port(port, timeout=60)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 302 is the answer a form post gets: keep it


class Browser:
    """One signed-in user: a cookie jar, the CSRF token, and every status it was answered with."""

    def __init__(self, base: str, *, username: str, password: str):
        self.base, self.jar, self.answers = base, http.cookiejar.CookieJar(), []
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)
        page = self.opener.open(f"{base}/login/", timeout=60).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        assert self.post("/login/", {"username": username, "password": password, "csrfmiddlewaretoken": token}) == 302

    def post(self, path: str, data: dict[str, str]) -> int:
        token = next((c.value for c in self.jar if c.name == "csrftoken"), "")
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, **data}).encode()
        request = urllib.request.Request(self.base + path, data=body, headers={"Referer": self.base + path})
        try:
            status = self.opener.open(request, timeout=120).status
        except urllib.error.HTTPError as exc:
            status = exc.code
        self.answers.append((path, status))
        return status


def count(db: Path, sql: str, *args) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute(sql, args).fetchone()[0]


def rows(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute(sql, args).fetchall()


def wait_for(done, *, timeout: float) -> bool:
    """Whether `done()` came true within `timeout` seconds; the assertions after say what did not."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def errors_in(log: Path) -> str:
    """The log's lines that name an error, counted by text (tracebacks' last lines)."""
    found: dict[str, int] = {}
    for line in log.read_text().splitlines():
        if re.match(r"^\w+(\.\w+)*(Error|Exception): ", line):
            found[line[:160]] = found.get(line[:160], 0) + 1
    return "; ".join(f"{n} x {text}" for text, n in found.items()) or "none"


def test_two_workers_and_the_web_server_write_to_one_sqlite_file_at_once(tmp_path):
    data_dir, db = tmp_path / "data", tmp_path / "eagle3web.sqlite3"
    data_dir.mkdir()
    env = sqlite_env(db, data_dir)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], env=env, cwd=BASE_DIR,
                   check=True, timeout=300)
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log", tmp_path / "web.log"]
    finished = ("succeeded", "failed", "cancelled")
    with ExitStack() as stack:
        for name, log in zip(("sqlite-a", "sqlite-b"), logs):
            stack.enter_context(celery_worker(data_root=data_dir, log_path=log, name=name,
                                              extra_env={"DATABASE_URL": env["DATABASE_URL"]}))
        base = stack.enter_context(web_server(env, logs[2]))
        made = json.loads(subprocess.run(
            [sys.executable, "-m", "tests.helpers.sqlite_site", str(data_dir), str(CHATS), str(EXTRACTIONS)], env=env,
            cwd=BASE_DIR, check=True, capture_output=True, text=True, timeout=300).stdout)
        # The catalogue is queued: one worker takes it; the other is free for the verifications.
        users = [Browser(base, username="writer", password=made["password"]) for _ in range(USERS)]
        catalogue_done = threading.Event()
        reviews_posted = [0] * USERS

        def press(u: int) -> None:
            started, n = time.monotonic(), 0
            while not catalogue_done.is_set() or time.monotonic() - started < MIN_SECONDS:
                extraction = made["extractions"][(u + n) % EXTRACTIONS]
                users[u].post(f"/extractions/{extraction}/verify/", {"full": "on"} if n % 2 else {})
                if users[u].post(f"/reviews/extraction/{extraction}/", {"decision": "comment",
                                                                        "text": f"user {u} look {n}"}) == 302:
                    reviews_posted[u] += 1
                n += 1

        threads = [threading.Thread(target=press, args=(u,), daemon=True) for u in range(USERS)]
        for thread in threads:
            thread.start()
        catalogue_status = "SELECT status FROM runs_datasetcatalogue WHERE id = ?"
        try:
            wait_for(lambda: rows(db, catalogue_status, made["catalogue"])[0][0] in finished, timeout=600)
        finally:
            catalogue_done.set()
            for thread in threads:
                thread.join(timeout=180)
        # What was asked last is done too (a hand-over left to a reconciler takes up to its period).
        wait_for(lambda: count(db, "SELECT COUNT(*) FROM runs_verificationrequest WHERE status NOT IN (?, ?, ?)",
                               *finished) == 0, timeout=180)
        pending = count(db, "SELECT COUNT(*) FROM runs_pendingenqueue")
    said = {log.name: errors_in(log) for log in logs}
    answers = [a for user in users for a in user.answers if a[0] != "/login/"]
    errors = [a for a in answers if a[1] != 302]
    print(json.dumps({  # shown when the test fails: every symptom at once, not only the first assertion's
        "posts": len(answers), "not_302": len(errors), "samples": count(db, "SELECT COUNT(*) FROM runs_datasetsample"),
        "catalogue": rows(db, "SELECT status, substr(error, 1, 60) FROM runs_datasetcatalogue"),
        "verifications": rows(db, "SELECT status, COUNT(*) FROM runs_verificationrequest GROUP BY status"),
        "outbox": pending, "log_errors": said}, indent=1))
    assert not errors, (f"{len(errors)} of {len(answers)} posts not answered 302", errors[:5], said)
    assert len(answers) >= 2 * USERS * 5  # the load did happen
    assert rows(db, "SELECT status, samples_added, samples_total, error FROM runs_datasetcatalogue WHERE id = ?",
                made["catalogue"]) == [("succeeded", CHATS, CHATS, "")], said
    assert count(db, "SELECT COUNT(DISTINCT sample_id) FROM runs_datasetsample WHERE dataset_id = ?",
                 made["dataset"]) == CHATS
    assert count(db, "SELECT COUNT(*) FROM runs_review") == sum(reviews_posted) == len(answers) // 2
    requests = rows(db, "SELECT status, error, verification_id FROM runs_verificationrequest")
    assert len(requests) >= EXTRACTIONS and all(r[0] == "succeeded" and r[2] for r in requests), (
        [r for r in requests if r[0] != "succeeded"][:5], said)
    # Each request's verification, beside the one each import made.
    assert count(db, "SELECT COUNT(*) FROM runs_verification") == EXTRACTIONS + len(requests)
    attempts = rows(db, "SELECT stage, outcome, error FROM runs_stageattempt WHERE outcome != 'succeeded'")
    assert attempts == [], attempts[:5]
    assert count(db, "SELECT COUNT(*) FROM runs_stageattempt") == 1 + len(requests)  # one attempt each
    assert pending == 0
    # Both workers wrote: one the catalogue, the other verifications meanwhile.
    assert len({w for (w,) in rows(db, "SELECT worker FROM runs_stageattempt")}) == 2
