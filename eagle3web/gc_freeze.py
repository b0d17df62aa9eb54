"""Keep Python's full garbage collections off the request path's tail.

A web process holds well over 100,000 objects once Django, the views and numpy are loaded, and a full
(generation-2) collection walks them all: `bench/tracker/metrics.py --scale-only` prints what one costs
(`gc_full_collection`: 133 ms for 265,732 objects in its process on this 2-core machine) and what it
costs once they are frozen (under 0.1 ms). What a process loaded to serve its first requests lives as
long as the process, so after them it is moved out of the collector's sight (gc.freeze(), as the CPython
docs advise for pre-fork servers): a full collection then walks only what requests made since. Full
collections come when survivors pile up (a quarter as many as the objects already collected), often in
a process's early requests, rarer later; the same benchmark's 40 requests after a warm-up showed the
freeze's effect on the tail in one run and not in others (docs/results.md).

When: at the start of a request, so that no other request's objects are alive then (a sync worker
serves one at a time); counting pages and API calls, not static files, which load nothing of the app.
Twice: after the first `requests` and again after ten times as many, because the first ones may all have
been a health check's /login/ while the pages people use had not loaded their templates yet. Acyclic
objects frozen are still freed by reference counting; a cycle that was garbage at a freeze stays until
the process exits, bounded by what the warm-up made.
"""
from __future__ import annotations

import gc
import threading


def freeze() -> None:
    """Collect what is garbage now, then leave every object alive out of later collections."""
    gc.collect()
    gc.freeze()


class FreezeAfterWarmup:
    """A WSGI application that freezes the process's objects before its (requests + 1)-th and its
    (10 × requests + 1)-th page or API request (0: never)."""

    def __init__(self, application, *, requests: int, static_prefix: str = "/static/"):
        self.application = application
        self.requests = requests
        self.static_prefix = static_prefix
        self.served = 0
        self._due = [requests, 10 * requests] if requests > 0 else []
        self._lock = threading.Lock()  # runserver and gunicorn's gthread serve requests in threads

    def __call__(self, environ, start_response):
        if not environ.get("PATH_INFO", "").startswith(self.static_prefix):
            with self._lock:
                if self._due and self.served >= self._due[0]:
                    self._due.pop(0)
                    freeze()
                self.served += 1
        return self.application(environ, start_response)
