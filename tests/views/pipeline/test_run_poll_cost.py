"""The run page's one poll while its run trains (issue 40; runs.api.views.run_poll): `status/?since=V&curves_start=S`
answers the status as `?since=V` does and the curves as `/metrics/?start=S&points=2000` does, the same bytes from
the same cache, after one read of the session, the user and the run's counters; 304 from those three queries while
neither moved, though its start moved with what the page merged. Through the real views, signed in, with the
workers' own write paths committed (transactional), so the counters move as in production."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs.models import StageStatus, TrainingRun
from runs.pipeline.lifecycle.stage_services import stage_progress
from runs.tracking.services import metrics_record
from tests.helpers.training_run import DEMO_KEYS, demo_points, signed_in, training_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def training(user, roots):
    return training_run(user, roots, demo_points(range(1, 501)))


def _get(client: Client, url: str, tag: str | None = None):
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(url, **({"HTTP_IF_NONE_MATCH": tag} if tag else {}))
    return answer, len(queries.captured_queries)


def _since(client: Client, run) -> int:
    return client.get(f"/api/v1/runs/{run.pk}/status/").json()["state_version"]


def test_one_poll_brings_the_status_and_the_new_points_and_304_while_neither_moved(user, training):
    page = signed_in(user)
    since = _since(page, training)
    url = f"/api/v1/runs/{training.pk}/status/?since={since}&curves_start={{}}"
    first, _ = _get(page, url.format(501))
    body = first.json()
    assert first.status_code == 200 and body["status"]["live"] and body["curves"]["start"] == 501
    assert all(s["steps"] == [] for s in body["curves"]["series"])
    # The worker's next flush and a step: one poll brings both.
    metrics_record(training_run_id=training.training_run.pk, points=demo_points(range(501, 521)))
    stage_progress(stage_name="train", record_id=training.training_run.pk, done=520, total=1000, log_tail="step 520")
    fresh, _ = _get(page, url.format(501), first["ETag"])
    body = fresh.json()
    assert fresh.status_code == 200 and fresh["ETag"] != first["ETag"]
    assert [s["steps"] for s in body["curves"]["series"]] == [list(range(501, 521))] * len(DEMO_KEYS)
    assert body["status"]["live"] and body["status"]["glance"]["latest"]["step"] == 520
    train = next(stage for stage in body["status"]["stages"] if stage["name"] == "train")
    assert (train["progress_done"], train["log_tail"]) == (520, "step 520")
    # Merged, the page asks from 521: nothing moved, so 304 from the session's, the user's and the counters' reads
    # (two polls, a status and a curves one, cost 3 + 3 before).
    again, queries = _get(page, url.format(521), fresh["ETag"])
    assert (again.status_code, again.content, queries) == (304, b"", 3)
    # A step alone: 200, the curves' window empty, the status moved.
    stage_progress(stage_name="train", record_id=training.training_run.pk, done=521, total=1000, log_tail="step 521")
    moved, _ = _get(page, url.format(521), fresh["ETag"])
    assert moved.status_code == 200 and moved.json()["status"]["stages"][0]["progress_done"] == 521
    assert all(s["steps"] == [] for s in moved.json()["curves"]["series"])
    # The training finishes: the state moved, so the status half is the whole summary with its new version.
    TrainingRun.objects.filter(run=training).update(status=StageStatus.SUCCEEDED, progress_done=1000)
    done = page.get(url.format(521), HTTP_IF_NONE_MATCH=moved["ETag"]).json()["status"]
    assert not done.get("live") and done["state_version"] > since
    assert next(s for s in done["stages"] if s["name"] == "train")["status"] == StageStatus.SUCCEEDED


def test_its_halves_are_the_separate_polls_answers_built_once_for_every_viewer(user, training):
    """The first viewer after a flush builds it; the next, another person holding the same, reads it from the
    cache: three queries. Its halves are byte for byte what the status and curves endpoints answer."""
    cache.clear()
    metrics_record(training_run_id=training.training_run.pk, points=demo_points(range(501, 521)))
    other = get_user_model().objects.create_superuser("viewer2", password="pw-viewer2-1")
    other.raw_password = "pw-viewer2-1"
    page = signed_in(user)
    since = _since(page, training)
    url = f"/api/v1/runs/{training.pk}/status/?since={since}&curves_start=501"
    built, built_queries = _get(page, url)
    read, read_queries = _get(signed_in(other), url)
    assert read.content == built.content and built_queries > read_queries == 3
    status = page.get(f"/api/v1/runs/{training.pk}/status/?since={since}").content
    window = page.get(f"/api/v1/runs/{training.pk}/metrics/?start=501&points=2000").content
    assert built.content == b'{"status": ' + status + b', "curves": ' + window + b"}"
    assert json.loads(built.content)["status"]["live"]
    # Built from nothing it costs what the two polls built from nothing cost, less one session, user and counters
    # read (measured: 8 where they cost 5 + 6).
    cache.clear()
    alone = [_get(page, url)[1] for url in (f"/api/v1/runs/{training.pk}/status/?since={since}",
                                            f"/api/v1/runs/{training.pk}/metrics/?start=501&points=2000")]
    cache.clear()
    assert (built_queries, alone) == (8, [5, 6])


def test_a_bad_curves_start_is_a_400_naming_it(user, training):
    answer = signed_in(user).get(f"/api/v1/runs/{training.pk}/status/?curves_start=-1")
    assert answer.status_code == 400 and "curves_start" in answer.json()["error"], answer.content
