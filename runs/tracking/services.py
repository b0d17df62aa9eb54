"""Writes of training curves: the workers' write path, and what a retry or a resume removes.

Each series (training run, split, key) keeps its points in chunks (runs.tracking.chunks) and its
summary (count, last, min, max and their steps) on its own row, updated as points arrive, so that
lists and compare tables never scan a curve's history.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np
from django.db import transaction

from runs.alerts import events as alert_events
from runs.pipeline.changes import curves_changed
from runs.tracking.chunks import CHUNK_POINTS, MERGE_AT, Points, pack, pack_one, preview, split_chunks, unpack
from runs.tracking.metric_names import RULE, is_metric_name, metric_name_shown
from runs.tracking.system_series import SYSTEM_PREFIX, SYSTEM_SPLIT
from workers.contract.errors import InputError
from runs.models import MetricChunk, MetricSeries


def _points_of(rows: list[dict], now: float) -> Points:
    """The rows of one series as arrays, ascending by step; a step given twice keeps its last value."""
    table = np.array([(r["step"], r["epoch"], r["value"], r.get("time") or now) for r in rows], dtype=np.float64)
    steps = np.array([r["step"] for r in rows], dtype=np.int64)  # exact even past 2**53
    order = np.argsort(steps, kind="stable")
    steps, table = steps[order], table[order]
    keep = np.ones(len(steps), dtype=bool)
    keep[:-1] = steps[1:] != steps[:-1]  # of equal steps, the last one written wins
    return Points(steps=steps[keep], epochs=table[keep, 1], values=table[keep, 2], times=table[keep, 3])


def _finite(value: float) -> bool:
    return value is not None and math.isfinite(value)


def _summary_update(series: MetricSeries, points: Points) -> None:
    series.num_points += len(points)
    if series.first_step is None:
        series.first_step = int(points.steps[0])
    series.last_step = int(points.steps[-1])
    series.last_value = float(points.values[-1])
    series.last_epoch = float(points.epochs[-1])
    finite = np.isfinite(points.values)
    series.num_non_finite += int((~finite).sum())
    if finite.any():
        values = np.where(finite, points.values, np.nan)
        lo, hi = int(np.nanargmin(values)), int(np.nanargmax(values))
        if not _finite(series.min_value) or values[lo] < series.min_value:
            series.min_value, series.min_step = float(values[lo]), int(points.steps[lo])
        if not _finite(series.max_value) or values[hi] > series.max_value:
            series.max_value, series.max_step = float(values[hi]), int(points.steps[hi])


def _append(series: MetricSeries, points: Points) -> None:
    """New points go in a chunk of their own (an INSERT costs what it adds; appending to a stored
    chunk rewrites all of it). The chunks not yet full are the series' last ones; once they hold a
    chunk's worth, or MERGE_AT of them pile up, they are merged into full chunks plus a remainder."""
    if series.open_points + len(points) < CHUNK_POINTS and series.open_chunks + 1 < MERGE_AT:
        MetricChunk.objects.create(series=series, **_chunk_fields(points))
        series.open_points += len(points)
        series.open_chunks += 1
        return
    open_chunks = list(series.chunks.filter(num_points__lt=CHUNK_POINTS).order_by("last_step"))
    merged = Points.concat([*(unpack(_columns(c)) for c in open_chunks), points])
    MetricChunk.objects.filter(pk__in=[c.pk for c in open_chunks]).delete()
    pieces = split_chunks(merged, 0)
    MetricChunk.objects.bulk_create([MetricChunk(series=series, **_chunk_fields(p)) for p in pieces])
    tail = len(pieces[-1]) if pieces and len(pieces[-1]) < CHUNK_POINTS else 0
    series.open_points, series.open_chunks = tail, int(tail > 0)


def _chunk_fields(points: Points) -> dict:
    # Only a full chunk never changes again, so only a full chunk's preview is kept (and read).
    whole = len(points) == CHUNK_POINTS
    return {"first_step": int(points.steps[0]), "last_step": int(points.steps[-1]), "num_points": len(points),
            "preview": pack_one(preview(points)) if whole else b"", **pack(points)}


def _columns(chunk: MetricChunk) -> dict[str, bytes]:
    return {"steps": chunk.steps, "epochs": chunk.epochs, "values": chunk.values, "times": chunk.times}


@transaction.atomic
def metrics_record(*, training_run_id: int, points: list[dict]) -> int:
    """Append points ({split, key, step, epoch, value[, time]}) to their series; how many were kept.

    A point whose step is not after its series' last step is refused and counted on the series
    (`num_refused`, shown with the curve): curves never hold two values for one step. A key that is not
    a metric name (runs.tracking.metric_names) stores nothing of the batch: our trainers never write one,
    so it is a bug to see, not a curve to keep."""
    for p in points:
        if not is_metric_name(p["key"]):
            raise InputError(f"metric key {metric_name_shown(p['key'])} is not a metric name ({RULE})")
    by_series: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in points:
        by_series[(str(p["split"]), str(p["key"]))].append(p)
    now, kept = time.time(), 0
    for (split, key), rows in sorted(by_series.items()):
        series = MetricSeries.objects.select_for_update().filter(training_run_id=training_run_id, split=split,
                                                                 key=key).first()
        if series is None:
            MetricSeries.objects.get_or_create(training_run_id=training_run_id, split=split, key=key)
            series = MetricSeries.objects.select_for_update().get(training_run_id=training_run_id, split=split,
                                                                  key=key)
        new = _points_of(rows, now)
        refused = len(rows) - len(new)  # repeated steps within the batch
        if series.last_step is not None:
            later = new.steps > series.last_step
            refused += int((~later).sum())
            new = new.take(later)
        if len(new):
            _append(series, new)
            _summary_update(series, new)
            kept += len(new)
        series.num_refused += refused
        series.save()
    curves_changed(training_run_id=training_run_id)  # live pages' polls see the points (runs.pipeline.changes)
    alert_events.metrics_recorded(training_run_id=training_run_id, points=points)  # a loss that is NaN
    return kept


def system_samples_record(*, training_run_id: int, samples: list[dict]) -> int:
    """Append a worker's samples ({time: Unix seconds, values: {"system/...": number}}) to the run's system
    series (runs.tracking.system_series): step = the time in milliseconds, epoch 0 (none applies)."""
    points = []
    for sample in samples:
        for key, value in sample["values"].items():
            if not str(key).startswith(SYSTEM_PREFIX):
                raise InputError(f"system series key {metric_name_shown(key)} does not start with {SYSTEM_PREFIX!r}")
            points.append({"split": SYSTEM_SPLIT, "key": key, "step": int(sample["time"] * 1000), "epoch": 0.0,
                           "value": float(value), "time": sample["time"]})
    return metrics_record(training_run_id=training_run_id, points=points) if points else 0


@transaction.atomic
def metrics_truncate(*, training_run_id: int, after_step: int) -> int:
    """Drop every point after `after_step` (a training resumed from that step writes them again);
    summaries are recomputed from what stays. Returns how many points went. The system series stay: their
    steps are times, not the training's steps (runs.tracking.system_series)."""
    removed = 0
    for series in MetricSeries.objects.select_for_update().filter(training_run_id=training_run_id).exclude(
            split=SYSTEM_SPLIT):
        if series.last_step is None or series.last_step <= after_step:
            continue
        chunks = list(series.chunks.filter(last_step__gt=after_step).order_by("first_step"))
        kept = Points.concat([unpack(_columns(c)) for c in chunks]).window(None, after_step)
        removed += sum(c.num_points for c in chunks) - len(kept)
        MetricChunk.objects.filter(pk__in=[c.pk for c in chunks]).delete()
        if len(kept):
            MetricChunk.objects.create(series=series, **_chunk_fields(kept))
        _summary_rebuild(series)
    MetricSeries.objects.filter(training_run_id=training_run_id, num_points=0).delete()
    if removed:
        curves_changed(training_run_id=training_run_id)
    return removed


def _summary_rebuild(series: MetricSeries) -> None:
    refused = series.num_refused
    for field in ("first_step", "last_step", "last_value", "last_epoch", "min_value", "min_step", "max_value",
                  "max_step"):
        setattr(series, field, None)
    series.num_points = series.num_non_finite = series.open_points = series.open_chunks = 0
    for chunk in series.chunks.order_by("last_step"):
        _summary_update(series, unpack(_columns(chunk)))
        if chunk.num_points < CHUNK_POINTS:
            series.open_points += chunk.num_points
            series.open_chunks += 1
    series.num_refused = refused
    series.save()
