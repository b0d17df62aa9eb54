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


def _get(app, path="/"):
    return app({"PATH_INFO": path}, lambda *a: None)


def test_freezes_before_the_request_after_the_warmup_and_again_after_ten_times_as_many(unfrozen):
    app = FreezeAfterWarmup(_answer, requests=3)
    for _ in range(3):
        assert _get(app) == [b"ok"]
    assert gc.get_freeze_count() == 0  # three answered, nothing frozen yet
    _get(app)  # the fourth: frozen before it is handled, with no other request's objects alive
    assert gc.get_freeze_count() > 1000  # the interpreter's and Django's objects
    gc.unfreeze()
    for _ in range(26):  # up to the 30th
        _get(app)
    assert gc.get_freeze_count() == 0
    _get(app)  # the 31st: the second freeze
    assert gc.get_freeze_count() > 1000
    gc.unfreeze()
    for _ in range(100):
        _get(app)
    assert gc.get_freeze_count() == 0  # twice only


def test_static_files_do_not_count(unfrozen):
    app = FreezeAfterWarmup(_answer, requests=2)
    for _ in range(10):
        _get(app, "/static/js/shared/page.js")
    _get(app, "/runs/compare/")
    _get(app, "/api/v1/runs/")
    assert gc.get_freeze_count() == 0
    _get(app, "/")
    assert gc.get_freeze_count() > 0


def test_a_request_that_raised_counts_too(unfrozen):
    def failing(environ, start_response):
        raise RuntimeError("a view's bug")

    app = FreezeAfterWarmup(failing, requests=1)
    with pytest.raises(RuntimeError):
        _get(app)
    with pytest.raises(RuntimeError):
        _get(app)
    assert gc.get_freeze_count() > 0


def test_zero_never_freezes(unfrozen):
    app = FreezeAfterWarmup(_answer, requests=0)
    for _ in range(5):
        _get(app)
    assert gc.get_freeze_count() == 0


def test_the_wsgi_application_is_wrapped_with_the_setting():
    from eagle3web import wsgi

    assert isinstance(wsgi.application, FreezeAfterWarmup)
    assert wsgi.application.requests == 20  # EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS's default
    assert wsgi.application.static_prefix == "/static/"
    assert type(wsgi.application.application).__name__ == "WSGIHandler"  # Django's, behind the wrapper
