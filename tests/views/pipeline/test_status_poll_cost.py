"""What a run page's status poll costs while the run trains (issue 40): a fixed number of queries whatever the
run holds, and a small body when only progress and points moved since the viewer's whole summary. Through the
real views, signed in, with the workers' own write paths committed (transactional), so the counters move as in
production."""
from __future__ import annotations

import json

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import StageAttempt, StageStatus, TrainingRun
from runs.pipeline import services
from runs.pipeline.lifecycle.result_records import checkpoints_register
from runs.pipeline.lifecycle.stage_services import stage_progress
from runs.tracking.services import metrics_record
from tests.helpers.training_run import DEMO_KEYS, training_run

pytestmark = pytest.mark.django_db(transaction=True)
# The live part's bound: the old code's answer to the same poll was 1,154 bytes (every stage's progress, the
# whole header), this one's 519 (the running stage's figures, the header's moving ones).
LIVE_BYTES = 600


@pytest.fixture
def viewer(client, user):
    assert client.login(username=user.username, password=user.raw_password)
    return client


def _training(user, roots, *, checkpoints: int, series: int, attempts: int):
    """A run whose training runs, with `checkpoints` checkpoints, `series` train curves of 20 steps and
    `attempts` earlier attempts of its stages (each with a log)."""
    run = training_run(user, roots)
    now, record = timezone.now(), TrainingRun.objects.get(run=run)
    StageAttempt.objects.bulk_create(
        StageAttempt(run=run, stage="train", record_id=record.pk, number=n + 1, worker="w", started_at=now,
                     finished_at=now, outcome=StageStatus.FAILED, error="lost", log_tail="step\n" * 200)
        for n in range(attempts))
    keys = [DEMO_KEYS[i % len(DEMO_KEYS)] + ("" if i < len(DEMO_KEYS) else f"_x{i}") for i in range(series)]
    metrics_record(training_run_id=record.pk, points=[
        {"split": "train", "key": key, "step": s, "epoch": s / 100, "value": 1.0 / s} for s in range(1, 21) for key in keys])
    if checkpoints:
        checkpoints_register(training_run_id=record.pk, checkpoints=[
            {"epoch": e, "path": f"/nowhere/{e}", "train_loss": 1.0, "val_loss": 2.0 - e / 100} for e in range(checkpoints)])
    stage_progress(stage_name="train", record_id=record.pk, done=20, total=400, log_tail="step 20: loss 0.05")
    return run, record


def _poll_queries(client, url: str) -> int:
    """Queries of one poll built from nothing (the cache emptied: the first viewer after a change pays them)."""
    cache.clear()
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def _whole(client, run) -> dict:
    return client.get(f"/api/v1/runs/{run.pk}/status/").json()


def test_a_status_poll_reads_as_many_queries_whatever_the_run_holds(viewer, user, roots):
    small, _ = _training(user, roots, checkpoints=1, series=2, attempts=1)
    large, _ = _training(user, roots, checkpoints=12, series=40, attempts=8)
    counts = {}
    for name, run in (("small", small), ("large", large)):
        since = f"/api/v1/runs/{run.pk}/status/?since={_whole(viewer, run)['state_version']}"
        counts[name] = (_poll_queries(viewer, since), _poll_queries(viewer, f"/api/v1/runs/{run.pk}/status/"))
    assert counts["small"] == counts["large"], counts
    # The live part: session, user, the counters (with the project check), the run with its stages, the
    # curves' latest values.
    assert counts["small"][0] == 5, counts


def test_a_status_poll_while_only_progress_and_points_moved_is_small_and_carries_them(viewer, user, roots):
    run, record = _training(user, roots, checkpoints=6, series=12, attempts=3)
    whole = viewer.get(f"/api/v1/runs/{run.pk}/status/")
    since = f"/api/v1/runs/{run.pk}/status/?since={whole.json()['state_version']}"
    first = viewer.get(since)
    assert first.status_code == 200 and len(first.content) <= LIVE_BYTES, (len(first.content), len(whole.content))
    # A new point and a step: the next poll carries them (and no more than before).
    metrics_record(training_run_id=record.pk, points=[{"split": "train", "key": "loss_0", "step": 21, "epoch": 0.21,
                                                      "value": 0.125}])
    stage_progress(stage_name="train", record_id=record.pk, done=21, total=400, log_tail="step 21: loss 0.04")
    moved = viewer.get(since, HTTP_IF_NONE_MATCH=first["ETag"])
    assert moved.status_code == 200 and len(moved.content) <= LIVE_BYTES, len(moved.content)
    body = moved.json()
    assert body["glance"]["latest"]["train"]["loss"][0] == 0.125 and body["glance"]["latest"]["step"] == 21
    train = next(stage for stage in body["stages"] if stage["name"] == "train")
    assert (train["progress_done"], train["log_tail"]) == (21, "step 21: loss 0.04")
    # Nothing moved since: 304, no body.
    assert viewer.get(since, HTTP_IF_NONE_MATCH=moved["ETag"]).status_code == 304


def test_the_run_page_is_not_built_again_while_only_progress_and_points_move(viewer, user, roots):
    run, record = _training(user, roots, checkpoints=2, series=12, attempts=1)
    page = viewer.get(f"/runs/{run.pk}/")
    held = json.loads(page.content.decode().split('<script id="run-summary-data" type="application/json">')[1]
                      .split("</script>")[0])
    assert held["state_version"] == _whole(viewer, run)["state_version"] and len(held["checkpoints"]) == 2
    stage_progress(stage_name="train", record_id=record.pk, done=21, total=400, log_tail="step 21")
    metrics_record(training_run_id=record.pk, points=[{"split": "train", "key": "loss_0", "step": 21, "epoch": 0.21,
                                                      "value": 0.125}])
    # Neither the summary nor the page's body is built again: the page is the one built for this state.
    with CaptureQueriesContext(connection) as queries:
        again = viewer.get(f"/runs/{run.pk}/")
    assert again.status_code == 200 and "runs/pipeline/_run_body.html" not in [t.name for t in again.templates]
    assert not any("runs_checkpoint" in query["sql"] for query in queries.captured_queries)
    assert str(again.context["body"]) in page.content.decode()
    # The page's script brings it up to date with its first poll: the live part since the page's state.
    live = viewer.get(f"/api/v1/runs/{run.pk}/status/?since={held['state_version']}").json()
    assert live["live"] and live["stages"][0]["progress_done"] == 21 and live["glance"]["latest"]["step"] == 21
