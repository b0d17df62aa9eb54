"""Curves through the workers' write path and back out of the chart and export endpoints."""
import csv
import io
import json

import numpy as np
import pytest

from runs.tracking.curves import CurveQuery, curve_window, series_points
from runs.tracking.chunks import CHUNK_POINTS
from runs.tracking.services import metrics_record, metrics_truncate
from runs.models import Dataset, MetricChunk, MetricSeries, PipelineRun, TargetModel, TrainingRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def training(user):
    target = TargetModel.objects.create(name="t", path="/t", architecture="LlamaForCausalLM", model_type="llama",
                                        num_layers=8, hidden_size=128, vocab_size=512)
    dataset = Dataset.objects.create(name="d", path="/d.jsonl")
    run = PipelineRun.objects.create(owner=user, target=target, dataset=dataset)
    return TrainingRun.objects.create(run=run, epochs=1, lr=1e-3, ttt_steps=2)


def points(steps, values, key="loss_0", split="train"):
    return [{"split": split, "key": key, "step": int(s), "epoch": s / 1000, "value": float(v)}
            for s, v in zip(steps, values)]


def test_points_fill_chunks_in_order_and_the_summary_follows(training):
    n = CHUNK_POINTS * 2 + 100
    values = np.linspace(5, 1, n)
    values[777] = 9.5
    for lo in range(0, n, 1000):  # flushes of 1,000 points, as a worker writes them
        metrics_record(training_run_id=training.pk, points=points(range(lo, min(n, lo + 1000)), values[lo:lo + 1000]))
    series = MetricSeries.objects.get(training_run=training, key="loss_0")
    assert series.num_points == n and series.first_step == 0 and series.last_step == n - 1
    assert series.max_value == 9.5 and series.max_step == 777
    assert series.min_value == pytest.approx(1.0) and series.min_step == n - 1
    assert list(series.chunks.values_list("num_points", flat=True)) == [CHUNK_POINTS, CHUNK_POINTS, 100]
    back = series_points(series=series)
    assert np.array_equal(back.steps, np.arange(n)) and np.array_equal(back.values, values)


def test_a_step_written_twice_is_refused_and_counted(training):
    metrics_record(training_run_id=training.pk, points=points([1, 2, 3], [1.0, 2.0, 3.0]))
    kept = metrics_record(training_run_id=training.pk, points=points([2, 3, 4], [9.0, 9.0, 4.0]))
    series = MetricSeries.objects.get(training_run=training)
    assert kept == 1 and series.num_refused == 2
    assert series_points(series=series).values.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_truncate_drops_the_steps_a_resumed_training_writes_again(training):
    n = CHUNK_POINTS + 500
    metrics_record(training_run_id=training.pk, points=points(range(n), np.arange(n, dtype=float)))
    metrics_record(training_run_id=training.pk, points=points(range(n), np.ones(n), key="lr"))
    removed = metrics_truncate(training_run_id=training.pk, after_step=99)
    assert removed == 2 * (n - 100)
    for series in MetricSeries.objects.filter(training_run=training):
        assert series.num_points == 100 and series.last_step == 99
        assert series_points(series=series).steps.tolist() == list(range(100))
    loss = MetricSeries.objects.get(training_run=training, key="loss_0")
    assert loss.max_value == 99.0 and loss.max_step == 99
    metrics_record(training_run_id=training.pk, points=points([100, 101], [7.0, 8.0]))
    assert MetricSeries.objects.get(pk=loss.pk).num_refused == 0


def test_a_chart_window_keeps_its_spikes_and_reads_previews_for_long_curves(training):
    n = 300_000  # more than 32 x 2,000: the whole-curve chart reads chunk previews
    values = np.sin(np.arange(n) / 500.0)
    values[123_456] = 50.0
    values[250_001] = -50.0
    values[10] = np.nan
    batch = 50_000
    for lo in range(0, n, batch):
        metrics_record(training_run_id=training.pk, points=points(range(lo, lo + batch), values[lo:lo + batch]))
    whole = curve_window(training_run_id=training.pk, query=CurveQuery(points=2000))[0]
    assert len(whole["steps"]) <= 2000 and whole["points_in_window"] == n and whole["downsampled"]
    assert 123_456 in whole["steps"] and 250_001 in whole["steps"] and 10 not in whole["steps"]
    assert whole["num_non_finite"] == 1
    window = curve_window(training_run_id=training.pk, query=CurveQuery(start=120_000, end=130_000, points=20_000))[0]
    assert window["points_in_window"] == 10_001 and not window["downsampled"]
    assert window["steps"] == list(range(120_000, 130_001))
    live = curve_window(training_run_id=training.pk, query=CurveQuery(start=n - 5))[0]
    assert live["steps"] == list(range(n - 5, n)) and live["last_step"] == n - 1


def test_the_endpoint_filters_by_key_and_split_and_refuses_bad_parameters(client, user, training):
    metrics_record(training_run_id=training.pk, points=points(range(10), range(10)) +
                   points(range(10), range(10), key="full_acc_0") + points([9], [0.5], split="val"))
    client.force_login(user)
    url = f"/api/v1/runs/{training.run_id}/metrics/"
    body = client.get(url, {"keys": "loss_0", "split": "train"}).json()
    assert [(s["split"], s["key"]) for s in body["series"]] == [("train", "loss_0")]
    assert len(client.get(url).json()["series"]) == 3
    for params, word in [({"points": "2"}, "points"), ({"start": "-1"}, "start"), ({"start": "9", "end": "3"}, "before"),
                         ({"split": "eval"}, "split"), ({"keys": "a" * 51}, "keys"), ({"keys": ",".join("k" * 65)}, "keys"),
                         ({"points": "1e9"}, "points")]:
        response = client.get(url, params)
        assert response.status_code == 400 and word in response.json()["error"], params
    assert client.get("/api/v1/runs/999999/metrics/").status_code == 404
    assert MetricChunk.objects.count() == 3  # reading changed nothing


def test_export_gives_every_point_as_csv_and_json(client, user, training):
    values = [1.5, float("nan"), 0.25]
    metrics_record(training_run_id=training.pk, points=points([0, 1, 2], values))
    client.force_login(user)
    url = f"/api/v1/runs/{training.run_id}/metrics/export/"
    response = client.get(url, {"key": "loss_0", "split": "train", "format": "csv"})
    assert response.status_code == 200 and "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [r["step"] for r in rows] == ["0", "1", "2"] and rows[1]["value"] == "nan" and float(rows[2]["value"]) == 0.25
    body = json.loads(b"".join(client.get(url, {"key": "loss_0", "split": "train", "format": "json"}).streaming_content))
    assert [p[0] for p in body["points"]] == [0, 1, 2] and body["points"][1][2] == "nan" and body["num_points"] == 3
    assert client.get(url, {"key": "loss_0"}).status_code == 400
    assert client.get(url, {"key": "nope", "split": "train"}).status_code == 400
    assert client.get(url, {"key": "loss_0", "split": "train", "format": "xml"}).status_code == 400
