"""One rule for a metric's name (runs.tracking.metric_names) at ingest: a reported point whose key is markup,
holds a NUL or a right-to-left mark, is empty or too long is a 400 naming points[i].key and the rule, and
nothing of its batch is stored; the names our trainings and the client report pass, and the export takes
every name ingest took. The workers' write path refuses the same keys."""
from __future__ import annotations

import pytest

from runs.models import MetricChunk, MetricSeries, TrainingRun
from runs.tracking.metric_names import RULE
from runs.tracking.services import metrics_record
from workers.contract.errors import InputError

pytestmark = pytest.mark.django_db

OURS = ["loss", "loss_0", "loss_2", "full_acc_0", "cond_acc_0", "lr", "tokens_per_s", "tokens_seen", "epoch"]
HOSTILE = ["loss<img src=x onerror=alert(1)>", "loss\x00", "loss\u202e0_ssol", "", "k" * 300,
           '<a href="javascript:alert(1)">x</a>', "loss 0", " loss_0"]


def _external_run(api) -> int:
    answer = api("launcher").post("/api/v1/runs/", {"external": True, "name": "elsewhere", "config": {}})
    assert answer.status_code == 201, answer.json()
    return answer.json()["id"]


@pytest.mark.parametrize("key", HOSTILE)
def test_a_key_that_is_not_a_metric_name_is_refused_naming_it_and_nothing_is_stored(api, key):
    run_id = _external_run(api)
    points = [{"key": "loss_0", "split": "train", "step": 1, "value": 2.0},
              {"key": key, "split": "train", "step": 1, "value": 1.0}]
    answer = api("launcher").post(f"/api/v1/runs/{run_id}/metrics/", {"points": points})
    assert answer.status_code == 400, answer.json()
    body = answer.json()
    # A NUL is refused before the name rule by the rule for text no database stores (eagle3web.unstorable_input).
    expected = "holds a NUL character" if "\x00" in key else RULE
    assert list(body["fields"]) == ["points[1].key"] and "points[1].key" in body["error"] and expected in body["error"]
    assert "\x00" not in body["error"] and "\u202e" not in body["error"]  # spelt out, not passed on
    assert not MetricSeries.objects.filter(training_run__run_id=run_id).exists()
    assert not MetricChunk.objects.filter(series__training_run__run_id=run_id).exists()


def test_our_trainings_names_are_taken_and_exported_by_the_name_they_were_stored_under(api):
    run_id = _external_run(api)
    points = [{"key": key, "split": "train", "step": step, "value": 1.0 / step} for key in OURS for step in (1, 2)]
    answer = api("launcher").post(f"/api/v1/runs/{run_id}/metrics/", {"points": points})
    assert answer.status_code == 200 and answer.json()["accepted"] == len(points), answer.json()
    assert set(MetricSeries.objects.filter(training_run__run_id=run_id).values_list("key", flat=True)) == set(OURS)
    for key in OURS:
        export = api("viewer").get(f"/api/v1/runs/{run_id}/metrics/export/", {"key": key, "split": "train",
                                                                              "format": "json"})
        assert export.status_code == 200, (key, export.content[:200])


def test_the_workers_write_path_refuses_a_key_that_is_not_a_metric_name(api):
    run_id = _external_run(api)
    training_id = TrainingRun.objects.get(run_id=run_id).pk
    with pytest.raises(InputError, match="is not a metric name"):
        metrics_record(training_run_id=training_id, points=[
            {"split": "train", "key": "loss_0", "step": 1, "epoch": 0.0, "value": 1.0},
            {"split": "train", "key": "<b>loss</b>", "step": 1, "epoch": 0.0, "value": 1.0}])
    assert not MetricSeries.objects.filter(training_run_id=training_id).exists()
