"""`make test` runs the suite in two pytest-xdist workers, one a core (`-n 2 --dist loadfile`: a file's tests
stay together, so a module's costly set-up, a vLLM server or a trained run, is made once). Each worker talks to
servers of its own: PostgreSQL's test database is pytest-django's, named per worker (test_test_gw0); Redis, the
broker and the cache, is the database below the one given (eagle3web/settings.py: gw0 the given one, gw1 the next
down).

A test that looks for processes by what they run (a vLLM server, a training rank) must keep to its own worker's:
`own_worker_process` tells them apart by the worker's name, which every process a test starts inherits."""
from __future__ import annotations

import os

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...; "" when pytest runs alone


def own_worker_process(proc) -> bool:
    """Whether the psutil process `proc` was started under this pytest worker (or by pytest alone)."""
    try:
        return proc.environ().get("PYTEST_XDIST_WORKER", "") == WORKER
    except Exception:  # gone, a zombie, or another user's: not ours  # noqa: BLE001
        return False
