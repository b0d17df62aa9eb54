"""Writes of training curves: the workers' write path, and what a retry or a resume removes.

Each series (training run, split, key) keeps its points in chunks (runs.tracking.chunks) and its
summary (count, last, min, max and their steps) on its own row, updated as points arrive, so that
lists and compare tables never scan a curve's history.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from functools import lru_cache
from operator import itemgetter

import numpy as np
from django.db import connection, transaction

from runs.pipeline.status.changes import curves_changed
from runs.tracking.chunks import CHUNK_POINTS, MERGE_AT, Points, pack, pack_one, preview, split_chunks, unpack
from runs.tracking.metric_names import RULE, is_metric_name, metric_name_shown
from runs.tracking.system_series import SYSTEM_PREFIX, SYSTEM_SPLIT
from workers.contract.errors import InputError
from runs.tracking.models import MetricChunk, MetricSeries
from runs.tracking import signals


def _points_of(rows: list[dict], now: float) -> Points:
    """The rows of one series as arrays, ascending by step; a step given twice keeps its last value."""
    n = len(rows)

    def column(name: str, dtype) -> np.ndarray:  # straight from the dicts: no tuple per point
        return np.fromiter(map(itemgetter(name), rows), dtype=dtype, count=n)

    steps = column("step", np.int64)  # exact even past 2**53
    times = np.fromiter([r.get("time") or now for r in rows], dtype=np.float64, count=n)
    points = Points(steps=steps, epochs=column("epoch", np.float64), values=column("value", np.float64), times=times)
    if n > 1 and not (steps[1:] > steps[:-1]).all():  # a worker's batch is in order already
        points = points.take(np.argsort(steps, kind="stable"))
        keep = np.ones(n, dtype=bool)
        keep[:-1] = points.steps[1:] != points.steps[:-1]  # of equal steps, the last one written wins
        points = points.take(keep)
    return points


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


def _append(series: MetricSeries, points: Points, *, created: list[MetricChunk], merging: dict) -> None:
    """New points go in a chunk of their own (an INSERT costs what it adds; appending to a stored
    chunk rewrites all of it). The chunks not yet full are the series' last ones; once they hold a
    chunk's worth, or MERGE_AT of them pile up, they are merged into full chunks plus a remainder.
    Nothing is written here: the new chunks go in `created` and the series to merge in `merging`, written
    for the whole batch at once by _chunks_write (a fixed number of queries whatever the series)."""
    if series.open_points + len(points) < CHUNK_POINTS and series.open_chunks + 1 < MERGE_AT:
        created.append(MetricChunk(series=series, **_chunk_fields(points)))
        series.open_points += len(points)
        series.open_chunks += 1
        return
    merging[series.pk] = (series, points)


def _chunks_write(*, created: list[MetricChunk], merging: dict) -> None:
    """Write a batch's chunks: its new chunks and, for the series whose open chunks are due, those chunks
    read, merged with the new points, deleted and written again as full chunks plus a remainder (one read,
    one delete and one insert for every series of the batch)."""
    if merging:
        open_chunks = defaultdict(list)
        for chunk in MetricChunk.objects.filter(series_id__in=list(merging), num_points__lt=CHUNK_POINTS).order_by(
                "series_id", "last_step"):
            open_chunks[chunk.series_id].append(chunk)
        MetricChunk.objects.filter(pk__in=[c.pk for chunks in open_chunks.values() for c in chunks]).delete()
        for series_id, (series, points) in merging.items():
            merged = Points.concat([*(unpack(_columns(c)) for c in open_chunks[series_id]), points])
            pieces = split_chunks(merged, 0)
            created.extend(MetricChunk(series=series, **_chunk_fields(p)) for p in pieces)
            tail = len(pieces[-1]) if pieces and len(pieces[-1]) < CHUNK_POINTS else 0
            series.open_points, series.open_chunks = tail, int(tail > 0)
    if created:
        _chunks_insert(created)


def _chunks_insert(chunks: list[MetricChunk]) -> None:
    """New chunks in one statement. On PostgreSQL by binary COPY: the arrays travel as they are, where an INSERT
    sent each as hex text inside the query (twice the bytes, parsed back by the server: 1.2-1.4 against
    0.55-0.65 ms for a 1,000-point chunk; issue 40); elsewhere (SQLite, the demo) bulk_create."""
    if connection.vendor != "postgresql":
        MetricChunk.objects.bulk_create(chunks)
        return
    statement, attnames, types = _chunk_copy()
    with connection.cursor() as cursor, cursor.copy(statement) as copy:
        copy.set_types(types)
        for chunk in chunks:
            copy.write_row([getattr(chunk, name) for name in attnames])


@lru_cache(maxsize=1)
def _chunk_copy() -> tuple[str, list[str], list[str]]:
    """_chunks_insert's COPY, the fields it writes and their types (looked up once, not per batch)."""
    fields = [f for f in MetricChunk._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    return (f'COPY "{MetricChunk._meta.db_table}" ({columns}) FROM STDIN (FORMAT BINARY)', [f.attname for f in fields],
            [f.db_type(connection) for f in fields])


def _chunk_fields(points: Points) -> dict:
    # Only a full chunk never changes again, so only a full chunk's preview is kept (and read).
    whole = len(points) == CHUNK_POINTS
    return {"first_step": int(points.steps[0]), "last_step": int(points.steps[-1]), "num_points": len(points),
            "preview": pack_one(preview(points)) if whole else b"", **pack(points)}


def _columns(chunk: MetricChunk) -> dict[str, bytes]:
    return {"steps": chunk.steps, "epochs": chunk.epochs, "values": chunk.values, "times": chunk.times}


# What a batch writes to each series' row (one UPDATE for all of them).
_SUMMARY_FIELDS = ("num_points", "first_step", "last_step", "last_value", "last_epoch", "min_value", "min_step",
                   "max_value", "max_step", "num_non_finite", "num_refused", "open_points", "open_chunks")


def _summaries_write(series: list[MetricSeries]) -> None:
    """The batch's summaries in one UPDATE. On PostgreSQL from a VALUES list (Django's bulk_update builds
    a CASE per field and row, which cost more to compile than the whole write took to run); elsewhere
    (SQLite, the demo) a save per series."""
    if connection.vendor != "postgresql":
        for row in series:
            row.save(update_fields=_SUMMARY_FIELDS)
        return
    params = [value for row in series for value in (row.pk, *(getattr(row, name) for name in _SUMMARY_FIELDS))]
    with connection.cursor() as cursor:
        cursor.execute(_summaries_sql(len(series)), params)


@lru_cache(maxsize=64)
def _summaries_sql(rows: int) -> str:
    """_summaries_write's UPDATE for `rows` series, built once per count (the fields' types took 0.4 ms of
    Python a batch to look up)."""
    fields = [MetricSeries._meta.get_field(name) for name in _SUMMARY_FIELDS]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    casts = "(%s, " + ", ".join(f"%s::{f.db_type(connection)}" for f in fields) + ")"
    assignments = ", ".join(f'"{f.column}" = v."{f.column}"' for f in fields)
    return (f'UPDATE "{MetricSeries._meta.db_table}" AS s SET {assignments} FROM (VALUES {", ".join([casts] * rows)}) '
            f'AS v(id, {columns}) WHERE s."id" = v.id')


_LOCKED_SQL = (f'SELECT * FROM "{MetricSeries._meta.db_table}" WHERE "training_run_id" = %s AND "key" = ANY(%s) '
               'ORDER BY "split", "key" FOR UPDATE')


def _series_locked(*, training_run_id: int, names: list[tuple[str, str]]) -> dict[tuple[str, str], MetricSeries]:
    """The batch's series of the run, locked, made first where missing: one query when all exist (every
    batch but a series' first), three otherwise."""
    wanted = set(names)

    keys = sorted({key for _, key in names})

    def locked():
        if connection.vendor == "postgresql":  # the ORM's compiling of this query was a tenth of a batch's Python
            rows = MetricSeries.objects.raw(_LOCKED_SQL, [training_run_id, keys])
        else:
            rows = MetricSeries.objects.select_for_update().filter(
                training_run_id=training_run_id, key__in=keys).order_by("split", "key")
        return {(s.split, s.key): s for s in rows if (s.split, s.key) in wanted}

    found = locked()
    if len(found) < len(wanted):
        MetricSeries.objects.bulk_create([MetricSeries(training_run_id=training_run_id, split=split, key=key)
                                          for split, key in sorted(wanted - set(found))], ignore_conflicts=True)
        found = locked()
    return found


@transaction.atomic
def metrics_record(*, training_run_id: int, points: list[dict]) -> int:
    """Append points ({split, key, step, epoch, value[, time]}) to their series; how many were kept.

    A point whose step is not after its series' last step is refused and counted on the series
    (`num_refused`, shown with the curve): curves never hold two values for one step. A key that is not
    a metric name (runs.tracking.metric_names) stores nothing of the batch: our trainers never write one,
    so it is a bug to see, not a curve to keep.

    A batch costs the same few queries whatever its series (tests/curves/test_write_queries.py): the
    series locked in one read, the new chunks in one insert, the summaries in one update, the run's
    change counters bumped once after commit. A loss series' first non-finite value is found in the
    batch's own arrays, and only then are the run's loss_nan rules asked (runs.alerts.events)."""
    by_series: dict[tuple[str, str], list[dict]] = defaultdict(list)
    named: set[str] = set()  # each key checked once, not at every point
    for p in points:
        key = p["key"]
        if type(key) is not str or key not in named:
            if not is_metric_name(key):
                raise InputError(f"metric key {metric_name_shown(key)} is not a metric name ({RULE})")
            named.add(key)
        by_series[(str(p["split"]), key)].append(p)
    if not by_series:
        return 0
    series_of = _series_locked(training_run_id=training_run_id, names=list(by_series))
    now, kept, created, merging, went_bad = time.time(), 0, [], {}, None
    for name, rows in sorted(by_series.items()):
        series = series_of[name]
        new = _points_of(rows, now)
        refused = len(rows) - len(new)  # repeated steps within the batch
        if series.last_step is not None:
            later = new.steps > series.last_step
            refused += int((~later).sum())
            new = new.take(later)
        if len(new):
            was_finite = series.num_non_finite == 0
            _append(series, new, created=created, merging=merging)
            _summary_update(series, new)
            kept += len(new)
            if went_bad is None and was_finite and series.num_non_finite and "loss" in series.key:
                at = int(np.argmax(~np.isfinite(new.values)))
                went_bad = {"split": series.split, "key": series.key, "step": int(new.steps[at]),
                            "value": float(new.values[at])}
        series.num_refused += refused
    _chunks_write(created=created, merging=merging)
    _summaries_write(list(series_of.values()))
    curves_changed(training_run_id=training_run_id)  # live pages' polls see the points (runs.pipeline.status.changes)
    if went_bad is not None:  # a loss series became NaN or infinite: the rules are asked then, not per batch
        signals.metrics_recorded.send(sender=MetricSeries, training_run_id=training_run_id, points=[went_bad])
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
