"""Polls that find nothing new are answered 304 from one query (runs.live, runs.pipeline.status.changes):
through the real views, signed in with a password, writes made by the workers' own services and
committed (transactional tests), so each counter moves exactly as it does in production."""
from __future__ import annotations

import pytest

from runs.models import TrainingRun
from runs.pipeline import services
from runs.pipeline.lifecycle.result_records import checkpoints_register
from runs.pipeline.lifecycle.stage_services import stage_heartbeat, stage_progress
from runs.tracking.services import metrics_record
from runs import live
from tests.helpers.training_run import training_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer(client, user):
    assert client.login(username=user.username, password=user.raw_password)
    return client


@pytest.fixture
def training(user, roots):
    """A run whose training runs (as a worker marks it), with steps 1..9 of one curve."""
    return training_run(user, roots, _points(range(1, 10)))


def _points(steps, key="loss_0"):
    return [{"split": "train", "key": key, "step": s, "epoch": s / 100, "value": 10.0 / s} for s in steps]


def _get(client, url, tag=None):
    return client.get(url, **({"HTTP_IF_NONE_MATCH": tag} if tag else {}))


def test_a_curve_poll_gets_304_until_a_point_arrives_then_200_with_it(viewer, training, django_assert_num_queries):
    url = f"/api/v1/runs/{training.pk}/metrics/?start=5&points=2000"
    first = _get(viewer, url)
    assert first.status_code == 200 and first["Cache-Control"] == "private, no-cache"
    assert first.json()["series"][0]["steps"] == [5, 6, 7, 8, 9]
    tag = first["ETag"]
    # Nothing new: 304, empty, and only the session's, the user's, and the run's counter read where its project
    # lets the user see it (runs.projects.access): 3 queries (4 when the check was a query of its own).
    with django_assert_num_queries(3):
        again = _get(viewer, url, tag)
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == tag
    metrics_record(training_run_id=training.training_run.pk, points=_points([10]))
    fresh = _get(viewer, url, tag)
    assert fresh.status_code == 200 and fresh["ETag"] != tag
    assert fresh.json()["series"][0]["steps"] == [5, 6, 7, 8, 9, 10]
    assert fresh.json()["series"][0]["last"] == 1.0
    assert _get(viewer, url, fresh["ETag"]).status_code == 304


def test_a_curve_etag_names_its_query_as_well(viewer, training):
    tag = _get(viewer, f"/api/v1/runs/{training.pk}/metrics/?start=5&end=9")["ETag"]
    other = _get(viewer, f"/api/v1/runs/{training.pk}/metrics/?start=6&end=9", tag)
    assert other.status_code == 200 and other.json()["series"][0]["steps"] == [6, 7, 8, 9]
    # A live poll's (a start, no end) names the curves' state and the rest of its query, not its start: the page
    # asks from the step after the newest it merged (tests/views/tracking/test_curve_poll_cost.py).
    tag = _get(viewer, f"/api/v1/runs/{training.pk}/metrics/?start=5")["ETag"]
    assert _get(viewer, f"/api/v1/runs/{training.pk}/metrics/?start=10", tag).status_code == 304
    assert _get(viewer, f"/api/v1/runs/{training.pk}/metrics/?start=10&points=100", tag).status_code == 200


def test_a_status_poll_gets_304_until_the_run_changes(viewer, training, django_assert_num_queries):
    url = f"/api/v1/runs/{training.pk}/status/"
    first = _get(viewer, url)
    assert first.status_code == 200 and first.json()["stages"][3]["progress_done"] == 0
    tag = first["ETag"]
    with django_assert_num_queries(3):
        assert _get(viewer, url, tag).status_code == 304
    # A heartbeat renews the lease only, which no page shows: still 304.
    record = TrainingRun.objects.get(run=training)
    assert stage_heartbeat(stage_name="train", record_id=record.pk, started_at=record.started_at)
    assert _get(viewer, url, tag).status_code == 304
    # Progress: 200 with it.
    stage_progress(stage_name="train", record_id=record.pk, done=7, total=40, log_tail="step 7")
    progressed = _get(viewer, url, tag)
    assert progressed.status_code == 200 and progressed["ETag"] != tag
    train = progressed.json()["stages"][3]
    assert (train["progress_done"], train["progress_total"], train["log_tail"]) == (7, 40, "step 7")
    tag = progressed["ETag"]
    # A point: the summary's latest loss moved (its header shows it).
    metrics_record(training_run_id=record.pk, points=_points([10]))
    pointed = _get(viewer, url, tag)
    assert pointed.status_code == 200 and pointed.json()["glance"]["latest"]["train"]["loss"] == [1.0]
    tag = pointed["ETag"]
    # A checkpoint.
    checkpoints_register(training_run_id=record.pk, checkpoints=[{"epoch": 0, "path": "/nowhere/0", "val_loss": 2.5}])
    registered = _get(viewer, url, tag)
    assert registered.status_code == 200 and [c["val_loss"] for c in registered.json()["checkpoints"]] == [2.5]


def test_a_status_poll_gets_200_once_a_stage_changes_status(viewer, user, training):
    url = f"/api/v1/runs/{training.pk}/status/"
    tag = _get(viewer, url)["ETag"]
    # The user cancels through the page's form (the services' write path).
    assert viewer.post(f"/runs/{training.pk}/cancel/").status_code == 302
    cancelled = _get(viewer, url, tag)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert [s["status"] for s in cancelled.json()["stages"]] == ["cancelled"] * 5
    tag = cancelled["ETag"]
    # Any write to a stage row counts, whoever makes it (here the ORM itself, as the admin would).
    TrainingRun.objects.filter(run=training).update(error="edited")
    edited = _get(viewer, url, tag)
    assert edited.status_code == 200 and edited.json()["stages"][3]["error"] == "edited"


def test_polls_need_a_login_even_with_a_current_etag(client, user, training):
    url, curves = f"/api/v1/runs/{training.pk}/status/", f"/api/v1/runs/{training.pk}/metrics/"
    assert client.login(username=user.username, password=user.raw_password)
    tag = client.get(url)["ETag"]
    curve_tag = client.get(curves)["ETag"]
    client.logout()
    for path, sent in ((url, tag), (curves, curve_tag)):
        answer = _get(client, path, sent)
        assert answer.status_code == 401 and answer.json()["error"].startswith("authentication required"), path
        assert "ETag" not in answer


def test_a_second_viewer_gets_the_first_ones_answer_without_building_it(client, user, training, django_user_model,
                                                                       django_assert_num_queries, monkeypatch):
    # A running run's summary is kept 2 s (its durations); signing in twice here may take longer.
    monkeypatch.setattr(live, "RUNNING_SECONDS", 600)
    assert client.login(username=user.username, password=user.raw_password)
    url = f"/api/v1/runs/{training.pk}/status/"
    built = client.get(url)
    other = django_user_model.objects.create_user("other", password="pw-other-1")
    client.logout()
    assert client.login(username=other.username, password="pw-other-1")
    with django_assert_num_queries(3):
        shared = client.get(url)
    assert shared.status_code == 200 and shared.content == built.content


def test_the_runs_list_is_built_again_when_a_run_changes_state_not_when_it_makes_progress(
        viewer, training, django_assert_num_queries):
    built = viewer.get("/").content.decode()
    assert f'data-run="{training.pk}" data-status="running"' in built
    record = TrainingRun.objects.get(run=training)
    stage_progress(stage_name="train", record_id=record.pk, done=3, total=40, log_tail="step 3")
    metrics_record(training_run_id=record.pk, points=_points([10]))
    # Session, user, and one statement of the viewer's projects, saved views, unread count and the list's
    # counters (runs.saved_views.viewer_reads): the table is the one built above.
    with django_assert_num_queries(3):
        again = viewer.get("/").content.decode()
    assert again.split('id="run-table"')[1] == built.split('id="run-table"')[1]
    assert viewer.post(f"/runs/{training.pk}/cancel/").status_code == 302
    assert f'data-run="{training.pk}" data-status="cancelled"' in viewer.get("/").content.decode()


def test_a_status_poll_since_the_state_it_holds_gets_the_live_part_until_the_state_moves(viewer, training):
    url = f"/api/v1/runs/{training.pk}/status/"
    whole = _get(viewer, url)
    version = whole.json()["state_version"]
    since = f"{url}?since={version}"
    record = TrainingRun.objects.get(run=training)
    stage_progress(stage_name="train", record_id=record.pk, done=7, total=40, log_tail="step 7")
    metrics_record(training_run_id=record.pk, points=_points([10]))
    part = _get(viewer, since)
    body = part.json()
    assert part.status_code == 200 and body["live"] is True and body["state_version"] == version
    # The running stage alone: a stage not running moves its fields only with the state.
    [train] = body["stages"]
    assert (train["name"], train["progress_done"], train["progress_total"], train["log_tail"]) == ("train", 7, 40, "step 7")
    assert body["glance"]["latest"]["train"]["loss"] == [1.0] and body["glance"]["train_step"] == 7
    assert "best_tau" not in body["glance"] and "checkpoints" not in body
    assert len(part.content) * 4 < len(whole.content), (len(part.content), len(whole.content))
    assert _get(viewer, since, part["ETag"]).status_code == 304
    # A checkpoint moves the state: the whole summary again, with its new version.
    checkpoints_register(training_run_id=record.pk, checkpoints=[{"epoch": 0, "path": "/nowhere/0", "val_loss": 2.5}])
    moved = _get(viewer, since, part["ETag"])
    assert moved.status_code == 200 and "live" not in moved.json()
    assert moved.json()["state_version"] > version and [c["val_loss"] for c in moved.json()["checkpoints"]] == [2.5]


@pytest.mark.parametrize("since", ["x", "-1", "1.5", "9" * 19])
def test_a_status_poll_since_what_is_not_a_version_is_refused_naming_it(viewer, training, since):
    answer = _get(viewer, f"/api/v1/runs/{training.pk}/status/?since={since}")
    assert answer.status_code == 400 and answer.json()["fields"] == {"since": answer.json()["error"]}
    assert answer.json()["error"].startswith("since must be a whole number")
