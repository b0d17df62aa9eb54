"""Keep Python's full garbage collections off the request path's tail.

A web process holds ~155,000 objects once Django, the views and numpy are loaded; every ~20 requests
Python's collector walks them all (a generation-2 collection: 50-90 ms on this 2-core machine), and
those requests made the runs list's p95 (bench/metrics.py --scale-only: the slow requests were exactly
the ones a full collection ran in). What a process loaded to serve its first requests lives as long
as the process, so after them it is moved out of the collector's sight (gc.freeze(), as the CPython
docs advise for pre-fork servers); later collections walk only what requests made since. Acyclic
objects frozen are still freed by reference counting; a cycle frozen in the warm-up stays until exit,
bounded by what those few requests made.
"""
from __future__ import annotations

import gc


def freeze() -> None:
    """Collect what is garbage now, then leave every object alive out of later collections."""
    gc.collect()
    gc.freeze()


class FreezeAfterWarmup:
    """A WSGI application that freezes the process's objects once `requests` requests were answered
    (0: never): the URLs, views, templates and caches the first requests load are then in memory."""

    def __init__(self, application, *, requests: int):
        self.application = application
        self.requests = requests
        self.served = 0

    def __call__(self, environ, start_response):
        try:
            return self.application(environ, start_response)
        finally:
            self.served += 1
            if self.served == self.requests:
                freeze()
