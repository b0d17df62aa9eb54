"""What the run page's curve poll costs while the run trains (issue 40): only the points after the newest one the
page holds, one answer built for every viewer, and 304 from three queries once the page holds the newest, though
its `start` moved with what it merged (static/js/runs/curves.js, runs.tracking.curve_api.poll_etag). Through the
real views, signed in, with the workers' own write path committed (transactional), so the counters move as in
production."""
from __future__ import annotations

import gzip

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.tracking.services import metrics_record
from tests.helpers.training_run import DEMO_KEYS, demo_points, signed_in, training_run

pytestmark = pytest.mark.django_db(transaction=True)
# A poll bringing one 2 s flush of the load benchmark's writer (20 steps of 12 curves) measured 15,462 bytes:
# the new points and each series' summary, nothing before the page's newest step.
POLL_BYTES = 16_000
# The same answers gzipped, measured: the poll 1,779 bytes, the whole curves (520 steps of 12) 50,528 of 294,677.
# (These made-up values compress well; random digits about 3 times, see docs/results.md.)
GZIPPED_POLL_BYTES = 2_000
GZIPPED_WHOLE_BYTES = 60_000


@pytest.fixture
def training(user, roots):
    return training_run(user, roots, demo_points(range(1, 501)))


def _get(client, url, tag=None):
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(url, **({"HTTP_IF_NONE_MATCH": tag} if tag else {}))
    return answer, len(queries.captured_queries)


def test_a_viewer_that_holds_the_newest_points_gets_304_though_its_start_moved(user, training):
    base = f"/api/v1/runs/{training.pk}/metrics/"
    page = signed_in(user)
    whole, _ = _get(page, f"{base}?points=2000")
    newest = max(s["last_step"] for s in whole.json()["series"])
    assert newest == 500
    # The page's first poll, from the step after its newest: no point yet, so 12 empty series.
    first, _ = _get(page, f"{base}?start=501&points=2000")
    assert first.status_code == 200 and all(s["steps"] == [] for s in first.json()["series"])
    # The worker's next flush: the poll brings its 20 steps of each curve, nothing older.
    metrics_record(training_run_id=training.training_run.pk, points=demo_points(range(501, 521)))
    fresh, _ = _get(page, f"{base}?start=501&points=2000", first["ETag"])
    assert fresh.status_code == 200 and fresh["ETag"] != first["ETag"]
    assert [s["steps"] for s in fresh.json()["series"]] == [list(range(501, 521))] * len(DEMO_KEYS)
    assert len(fresh.content) <= POLL_BYTES, len(fresh.content)
    # Merged, the page asks from 521 with that answer's ETag: nothing came since, so 304, no body, and only the
    # session's, the user's and the run's counter queries. The old code keyed the ETag by `start` too, so a
    # moved start got 200 with every series' summary (4,262 bytes, 5 queries) each time.
    again, queries = _get(page, f"{base}?start=521&points=2000", fresh["ETag"])
    assert (again.status_code, again.content, queries) == (304, b"", 3)
    # Another query (keys) or a whole read does not take a poll's ETag.
    other, _ = _get(page, f"{base}?keys=loss_0&start=521&points=2000", fresh["ETag"])
    assert other.status_code == 200
    assert _get(page, f"{base}?points=2000", fresh["ETag"])[0].status_code == 200
    # A point later, the same poll is a 200 with it.
    metrics_record(training_run_id=training.training_run.pk, points=demo_points([521]))
    moved, _ = _get(page, f"{base}?start=521&points=2000", fresh["ETag"])
    assert moved.status_code == 200 and moved.json()["series"][0]["steps"] == [521]


def test_every_viewer_of_the_same_state_reads_one_built_answer(user, training):
    """The first viewer after a flush builds the poll (its series and chunks read); the next, another person
    asking the same (the same newest step), reads it from the cache: the three queries of any request."""
    cache.clear()
    base = f"/api/v1/runs/{training.pk}/metrics/?start=501&points=2000"
    metrics_record(training_run_id=training.training_run.pk, points=demo_points(range(501, 521)))
    other = get_user_model().objects.create_superuser("viewer2", password="pw-viewer2-1")
    other.raw_password = "pw-viewer2-1"
    built, built_queries = _get(signed_in(user), base)
    read, read_queries = _get(signed_in(other), base)
    assert read.content == built.content and built_queries > read_queries == 3


def test_a_browser_gets_the_poll_and_the_whole_curves_gzipped_once_built(user, training):
    """Browsers send Accept-Encoding: gzip; the cached answer is compressed once for all of them (runs.live),
    its ETag the same one, weak: the page's next poll with it still gets 304."""
    base = f"/api/v1/runs/{training.pk}/metrics/"
    page = signed_in(user)
    metrics_record(training_run_id=training.training_run.pk, points=demo_points(range(501, 521)))
    for url, most in ((f"{base}?start=501&points=2000", GZIPPED_POLL_BYTES), (f"{base}?points=2000", GZIPPED_WHOLE_BYTES)):
        plain = page.get(url)
        packed = page.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
        assert packed["Content-Encoding"] == "gzip" and "Accept-Encoding" in packed["Vary"]
        assert gzip.decompress(packed.content) == plain.content and packed["ETag"] == "W/" + plain["ETag"]
        assert len(packed.content) <= most, (url, len(plain.content), len(packed.content))
    poll, queries = _get(page, f"{base}?start=521&points=2000", page.get(
        f"{base}?start=501&points=2000", HTTP_ACCEPT_ENCODING="gzip")["ETag"])
    assert (poll.status_code, queries) == (304, 3)
    # Small answers (here one series' empty window) and clients that do not take gzip get the body as it is.
    small = page.get(f"{base}?keys=loss_0&start=9999", HTTP_ACCEPT_ENCODING="gzip")
    assert "Content-Encoding" not in small and small.json()["series"][0]["steps"] == []
    assert "Content-Encoding" not in page.get(f"{base}?points=2000", HTTP_ACCEPT_ENCODING="gzip;q=0, identity")
