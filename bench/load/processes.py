"""What the benchmarks that start servers share: a scratch PostgreSQL database, and processes started
in their own group and stopped with all their children."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def database_admin(url: str, sql: str) -> None:
    """Run `sql` ({name} is the database of `url`) on the server's postgres database, outside any transaction."""
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(sql.format(name=name))


def start(cmd: list[str], *, env: dict, log: Path) -> subprocess.Popen:
    # Its own process group, so that stopping it stops its children (gunicorn's and celery's workers).
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return
