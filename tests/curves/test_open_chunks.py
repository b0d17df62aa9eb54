"""A series' open chunks (not yet full) as the workers' write path keeps them: the merge into a full chunk writes the
open points from this process's memory of them (runs.tracking.services._open_known) where it holds, and reads
them back where another process (or a truncation) wrote the series since. Whichever way, the chunks stored are
the same, and every point comes back out as it went in, byte for byte. Each batch its own transaction, as a
worker writes them (the series row's version then moves with every write)."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from django.db import transaction

from runs.models import MetricChunk, MetricSeries
from runs.tracking import services
from runs.tracking.chunks import CHUNK_POINTS, Points, preview, unpack, unpack_one
from runs.tracking.curve_api import _csv_rows
from runs.tracking.curves import series_points
from runs.tracking.reported_points import points_report
from runs.tracking.services import metrics_record, metrics_truncate
from tests.curves.test_metric_store import training  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_memory():
    services._open.clear()  # nothing from another test's series

# Odd sizes: a batch inside an open chunk, one that fills it exactly, one that crosses one or two boundaries,
# and forty of one point (the open chunks then pile up to MERGE_AT and merge short of a full chunk).
SIZES = [1, 7, 333, 4095, 1, 4097, 1000, 2, 3, 9000, 100] + [1] * 40 + [4096, 17, 2500, 1700]


def _batch(key: str, steps: np.ndarray, values: np.ndarray, epochs: np.ndarray, times: np.ndarray | None = None):
    rows = [{"split": "train", "key": key, "step": int(s), "epoch": float(e), "value": float(v)}
            for s, e, v in zip(steps, epochs, values)]
    if times is not None:
        for row, t in zip(rows, times):
            row["time"] = float(t)
    return rows


def _written(n: int, seed: int) -> Points:
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.integers(1, 5, n)).astype(np.int64) + 2**52  # gaps, and past 2**52
    values = rng.normal(0, 1, n)
    values[rng.integers(0, n, 20)] = np.nan
    values[rng.integers(0, n, 5)] = np.inf
    values[:3] = [-0.0, 5e-324, -np.inf]
    return Points(steps=steps, epochs=rng.random(n) * 3, values=values, times=1.7e9 + np.arange(n) * 0.125)


def _write(training_run_id: int, key: str, points: Points, *, forget_every: int = 0) -> None:
    """Points in SIZES' batches; every `forget_every`-th batch as a process that never wrote the series (no memory)."""
    lo, turn = 0, 0
    while lo < len(points):
        part = points.take(slice(lo, lo + SIZES[turn % len(SIZES)]))
        if forget_every and turn % forget_every == 0:
            services._open.clear()
        metrics_record(training_run_id=training_run_id, points=_batch(key, part.steps, part.values, part.epochs,
                                                                      part.times))
        lo, turn = lo + len(part), turn + 1


def _rows(series: MetricSeries) -> list[tuple]:
    return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in series.chunks.order_by(
        "first_step").values_list("first_step", "last_step", "num_points", "steps", "epochs", "values", "times",
                                  "preview")]


def test_chunks_are_the_same_whether_the_open_points_come_from_memory_or_are_read_back(training):  # noqa: F811
    points = _written(40_000, seed=1)
    _write(training.pk, "loss_0", points)  # one process throughout: the memory serves every merge but its first
    _write(training.pk, "loss_1", points, forget_every=1)  # read back at every merge, as before the memory
    _write(training.pk, "loss_2", points, forget_every=3)  # now one, now the other
    series = {s.key: s for s in MetricSeries.objects.filter(training_run=training)}
    remembered = _rows(series["loss_0"])
    assert remembered == _rows(series["loss_1"]) == _rows(series["loss_2"])
    sizes = [n for _, _, n, *_ in remembered]
    full = sum(1 for n in sizes if n == CHUNK_POINTS)
    assert full >= 8 and all(n < CHUNK_POINTS for n in sizes[full:])  # the open chunks are the last ones
    assert series["loss_0"].open_points == sum(sizes[full:]) and series["loss_0"].open_chunks == len(sizes) - full
    for first, last, n, steps, epochs, values, times, shown in remembered[:full]:
        chunk = unpack({"steps": steps, "epochs": epochs, "values": values, "times": times})
        assert (first, last) == (chunk.steps[0], chunk.steps[-1])
        assert unpack_one(shown).steps.tolist() == preview(chunk).steps.tolist()
    back = series_points(series=series["loss_0"])
    for name in ("steps", "epochs", "values", "times"):
        assert getattr(back, name).tobytes() == getattr(points, name).tobytes(), name


def test_a_truncation_inside_the_open_chunk_by_another_process_is_not_undone_by_this_ones_memory(training):  # noqa: F811
    first = _written(3000, seed=2)
    metrics_record(training_run_id=training.pk, points=_batch("loss_0", first.steps, first.values, first.epochs))
    stale = dict(services._open.kept)  # this process's memory: the 3,000 open points as it wrote them
    assert len(next(iter(stale.values()))[1]) == 3000
    # Another process resumes the training from the middle of the open chunk and writes those steps again, other
    # values, as many points as before (the same count and last step: only the row's version tells).
    services._open.clear()
    keep = 1000
    assert metrics_truncate(training_run_id=training.pk, after_step=int(first.steps[keep - 1])) == 3000 - keep
    again = first.values.copy()
    again[keep:] += 100.0
    metrics_record(training_run_id=training.pk, points=_batch("loss_0", first.steps[keep:], again[keep:],
                                                              first.epochs[keep:]))
    series = MetricSeries.objects.get(training_run=training)
    assert (series.open_points, series.last_step) == (3000, int(first.steps[-1]))
    services._open.kept.update(stale)
    # Back in this process: the next batch fills the chunk, which must hold the other process's values.
    later = _written(2000, seed=3)
    later.steps += int(first.steps[-1]) - int(later.steps[0]) + 1
    metrics_record(training_run_id=training.pk, points=_batch("loss_0", later.steps, later.values, later.epochs))
    back = series_points(series=series)
    assert back.values.tobytes() == np.concatenate([again, later.values]).tobytes()
    assert list(MetricChunk.objects.filter(series=series).order_by("first_step").values_list("num_points", flat=True)) \
        == [CHUNK_POINTS, 5000 - CHUNK_POINTS]


def test_the_csv_export_gives_back_what_was_written_byte_for_byte(client, user, training):  # noqa: F811
    points = _written(10_000, seed=4)
    _write(training.pk, "loss_0", points, forget_every=5)
    client.force_login(user)
    response = client.get(f"/api/v1/runs/{training.run_id}/metrics/export/",
                          {"key": "loss_0", "split": "train", "format": "csv"})
    body = b"".join(response.streaming_content)
    assert body == "".join(_csv_rows([points])).encode()
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert len(rows) == 10_000 and rows[0]["value"] == "-0.0" and rows[1]["value"] == "5e-324"


def _report(training_run_id: int, key: str, part: Points):
    """A batch as the API stores it (runs.pipeline.launch.external holds the transaction), the times given."""
    with transaction.atomic():
        return points_report(training_run_id=training_run_id, points=_batch(key, part.steps, part.values, part.epochs,
                                                                            part.times))


def _consistent(series: MetricSeries) -> None:
    """The series' open_points/open_chunks are its chunks not yet full, which are its last ones."""
    series.refresh_from_db()
    sizes = list(series.chunks.order_by("first_step").values_list("num_points", flat=True))
    full = sizes.count(CHUNK_POINTS)
    assert sizes[:full] == [CHUNK_POINTS] * full
    assert (series.open_points, series.open_chunks) == (sum(sizes[full:]), len(sizes) - full)


def test_api_reports_after_a_workers_batches_store_what_the_worker_alone_would(training):  # noqa: F811
    """Batches by turns from a worker (metrics_record) and the API (points_report) on one series, an API batch sent
    twice: the chunks the same as one writer's, and every point back byte for byte."""
    points = _written(30_000, seed=6)
    points.values[~np.isfinite(points.values)] = 0.25  # the API takes finite values only: the same for both series
    lo, turn = 0, 0
    while lo < len(points):
        part = points.take(slice(lo, lo + SIZES[turn % len(SIZES)]))
        metrics_record(training_run_id=training.pk, points=_batch("loss_1", part.steps, part.values, part.epochs,
                                                                  part.times))
        if turn % 2:
            assert _report(training.pk, "loss_0", part).accepted == len(part)
            again = _report(training.pk, "loss_0", part)  # a client's retry: nothing doubled
            assert (again.accepted, again.unchanged, again.replaced) == (0, len(part), 0)
        else:
            metrics_record(training_run_id=training.pk, points=_batch("loss_0", part.steps, part.values,
                                                                      part.epochs, part.times))
        lo, turn = lo + len(part), turn + 1
    series = {s.key: s for s in MetricSeries.objects.filter(training_run=training)}
    assert _rows(series["loss_0"]) == _rows(series["loss_1"])
    _consistent(series["loss_0"])
    back = series_points(series=series["loss_0"])
    for name in ("steps", "epochs", "values", "times"):
        assert getattr(back, name).tobytes() == getattr(points, name).tobytes(), name


def test_a_workers_batch_after_an_api_rewrite_merges_the_rewritten_points(client, user, training):  # noqa: F811
    """An API batch resending steps from a full chunk into the open ones, some values corrected, rewrites those
    chunks; the worker's next batch, in the process that remembered the old open points, merges the new ones."""
    points = _written(13_000, seed=7)
    _write(training.pk, "loss_0", points.take(slice(0, 10_000)))  # 2 full chunks, open ones this process remembers
    series = MetricSeries.objects.get(training_run=training)
    assert series.open_points == 10_000 - 2 * CHUNK_POINTS and services._open.kept
    resent = points.take(slice(7_000, 9_000))
    resent.values[::2] += 1.0  # every other value corrected
    resent.values[~np.isfinite(resent.values)] = 0.5
    counts = _report(training.pk, "loss_0", resent)
    assert (counts.accepted, counts.unchanged + counts.replaced) == (0, 2_000) and counts.replaced >= 1_000
    assert series.pk not in services._open.kept  # what this process kept of the open points no longer holds
    _consistent(series)
    points.values[7_000:9_000] = resent.values
    rest = points.take(slice(10_000, 13_000))  # fills the open chunk: merged with the rewritten points
    metrics_record(training_run_id=training.pk, points=_batch("loss_0", rest.steps, rest.values, rest.epochs,
                                                              rest.times))
    _consistent(series)
    assert series.open_points == 13_000 - 3 * CHUNK_POINTS
    back = series_points(series=series)
    for name in ("steps", "epochs", "values", "times"):
        assert getattr(back, name).tobytes() == getattr(points, name).tobytes(), name
    client.force_login(user)
    response = client.get(f"/api/v1/runs/{training.run_id}/metrics/export/",
                          {"key": "loss_0", "split": "train", "format": "csv"})
    assert b"".join(response.streaming_content) == "".join(_csv_rows([points])).encode()
