"""A real Celery worker process for end-to-end tests, on the test database and the test broker."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from django.conf import settings
from django.db import connection

BASE_DIR = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The URL of the database pytest-django created, so that the worker sees the tests' rows."""
    db = connection.settings_dict
    if "postgresql" not in db["ENGINE"]:
        raise RuntimeError("end-to-end tests need PostgreSQL: run them through `make test` (DATABASE_URL)")
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@contextmanager
def celery_worker(*, data_root: Path, log_path: Path, ready_timeout: float = 90,
                  extra_env: dict[str, str] | None = None, name: str = "test-worker", queues: str = "cpu,gpu",
                  purge: bool = True) -> Iterator[subprocess.Popen]:
    """`name`: the node name before its "@" (two workers at once need two). `purge`: empty its queues
    first (a worker started beside another that already works must not: it would drop live messages)."""
    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("redis://"):
        raise RuntimeError(f"end-to-end tests need Redis as the broker (CELERY_BROKER_URL), got {broker!r}")
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "CELERY_BROKER_URL": broker,
        "EAGLE3WEB_DATA_DIR": str(data_root),
        "EAGLE3WEB_DATA_ROOTS": str(data_root),
        "EAGLE3WEB_RUNS_DIR": str(settings.EAGLE3WEB_RUNS_DIR),
        "EAGLE3WEB_PROGRESS_INTERVAL": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(extra_env or {}),
    }
    celery = [sys.executable, "-m", "celery", "-A", "eagle3web"]
    # Messages left by an earlier, interrupted session would name runs this database never had.
    if purge:
        subprocess.run([*celery, "purge", "-f", "-Q", queues], env=env, cwd=BASE_DIR, check=True,
                       capture_output=True, timeout=60)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [*celery, "worker", "-Q", queues, "--concurrency", "1", "-n", f"{name}-{os.getpid()}@%h",
         "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        env=env, cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so that a test can kill it with its pool children
    )
    try:
        deadline = time.monotonic() + ready_timeout
        while "ready." not in log_path.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def kill_worker_hard(proc: subprocess.Popen) -> None:
    """SIGKILL the worker and its pool processes at once, as an OOM killer or a lost host would."""
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for_run(run_id: int, *, timeout: float, log_path: Path | None = None):
    """Poll the database until every stage of the run has finished; return its summary."""
    from runs.pipeline import selectors
    from runs.pipeline.status.run_summary import run_summary
    from runs.pipeline.status.run_status import run_is_finished

    deadline = time.monotonic() + timeout
    while True:
        run = selectors.run_list().get(pk=run_id)
        if run_is_finished(run):
            return run_summary(run)
        if time.monotonic() > deadline:
            tail = log_path.read_text()[-4000:] if log_path else ""
            raise AssertionError(f"run {run_id} not finished after {timeout} s: {run_summary(run)['stages']}\n{tail}")
        time.sleep(1)


def started_here(proc) -> bool:
    """Whether the psutil process `proc` was started under this pytest process. `make test` runs two pytest-xdist
    workers side by side (a file's tests on one; each its own test database and Redis database, eagle3web/settings.py):
    a test that looks for processes by what they run (a vLLM server, a training rank) keeps to its own worker's,
    told apart by the worker's name (PYTEST_XDIST_WORKER), which every process a test starts inherits."""
    try:
        return proc.environ().get("PYTEST_XDIST_WORKER", "") == os.environ.get("PYTEST_XDIST_WORKER", "")
    except Exception:  # gone, a zombie, or another user's: not ours  # noqa: BLE001
        return False
