"""The web process's application freezes what its first requests loaded (eagle3web.gc_freeze): the
objects alive then leave the collector's generations, and later full collections walk only what came
after. The wrapper's count, and that eagle3web.wsgi's application is wrapped."""
from __future__ import annotations

import gc

import pytest

from eagle3web.gc_freeze import FreezeAfterWarmup

@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process goes on with its objects in the generations, as before


def _answer(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def test_the_objects_alive_after_the_warmup_requests_are_frozen_once(unfrozen):
    app = FreezeAfterWarmup(_answer, requests=3)
    for _ in range(2):
        assert app({}, lambda *a: None) == [b"ok"]
    assert gc.get_freeze_count() == 0  # not before the third
    app({}, lambda *a: None)
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # the interpreter's and Django's objects
    gc.unfreeze()
    app({}, lambda *a: None)
    assert gc.get_freeze_count() == 0  # once only


def test_a_request_that_raises_counts_too(unfrozen):
    def failing(environ, start_response):
        raise RuntimeError("a view's bug")

    app = FreezeAfterWarmup(failing, requests=1)
    with pytest.raises(RuntimeError):
        app({}, lambda *a: None)
    assert gc.get_freeze_count() > 0


def test_zero_never_freezes(unfrozen):
    app = FreezeAfterWarmup(_answer, requests=0)
    for _ in range(5):
        app({}, lambda *a: None)
    assert gc.get_freeze_count() == 0


def test_the_wsgi_application_is_wrapped_with_the_setting():
    from eagle3web import wsgi

    assert isinstance(wsgi.application, FreezeAfterWarmup)
    assert wsgi.application.requests == 20  # EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS's default
    assert type(wsgi.application.application).__name__ == "WSGIHandler"  # Django's, behind the wrapper
