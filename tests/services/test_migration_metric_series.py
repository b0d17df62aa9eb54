"""Migration 0013 moves every stored metric point into chunked series: none lost, a step stored
twice keeps its later value (and is counted as refused), summaries as the write path would keep them."""
import numpy as np
import pytest

from tests.migration_steps import migrate, migrate_to_latest

BEFORE = [("runs", "0012_extract_stage_and_artifact_provenance")]
AFTER = [("runs", "0013_metric_series")]


@pytest.mark.django_db(transaction=True)
def test_points_become_series_and_chunks():
    from runs.tracking.chunks import CHUNK_POINTS, unpack

    old = migrate(BEFORE)
    user = old.get_model("auth", "User").objects.create(username="ana")
    target = old.get_model("runs", "TargetModel").objects.create(
        name="t", path="/t", architecture="a", model_type="llama", num_layers=8, hidden_size=16, vocab_size=100)
    dataset = old.get_model("runs", "Dataset").objects.create(name="d", path="/d")
    run = old.get_model("runs", "PipelineRun").objects.create(owner_id=user.pk, target_id=target.pk,
                                                              dataset_id=dataset.pk)
    training = old.get_model("runs", "TrainingRun").objects.create(run=run, epochs=1, lr=1e-3, ttt_steps=1)
    Point = old.get_model("runs", "MetricPoint")
    n = CHUNK_POINTS + 10
    Point.objects.bulk_create([Point(training_run=training, split="train", key="loss_0", step=s, epoch=s / n,
                                     value=float(n - s)) for s in range(n)])
    Point.objects.create(training_run=training, split="train", key="loss_0", step=5, epoch=0.0, value=99.0)
    Point.objects.create(training_run=training, split="val", key="full_acc_0", step=3, epoch=0.5, value=float("nan"))

    new = migrate(AFTER)
    Series = new.get_model("runs", "MetricSeries")
    loss = Series.objects.get(split="train", key="loss_0")
    assert (loss.num_points, loss.first_step, loss.last_step, loss.num_refused) == (n, 0, n - 1, 1)
    assert loss.max_value == n and loss.max_step == 0 and loss.min_value == 1.0 and loss.min_step == n - 1
    assert (loss.open_points, loss.open_chunks) == (10, 1)
    chunks = list(new.get_model("runs", "MetricChunk").objects.filter(series=loss).order_by("last_step"))
    assert [c.num_points for c in chunks] == [CHUNK_POINTS, 10]
    values = np.concatenate([unpack({"steps": c.steps, "epochs": c.epochs, "values": c.values,
                                     "times": c.times}).values for c in chunks])
    assert values[5] == 99.0 and len(values) == n
    acc = Series.objects.get(split="val")
    assert acc.num_non_finite == 1 and acc.min_value is None
    migrate_to_latest()
