"""Writes of training curves: the one append of points (workers' and API's), what a retry or a resume removes.

Each series (training run, split, key) keeps its points in chunks (runs.tracking.chunks) and its
summary (count, last, min, max and their steps) on its own row, updated as points arrive, so that
lists and compare tables never scan a curve's history.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from functools import lru_cache

import numpy as np
from django.db import connection, transaction

from eagle3web.db import server_cursor
from runs.pipeline.status.changes import curves_bump_sql, curves_changed
from runs.tracking.chunks import (CHUNK_POINTS, COLUMNS, MERGE_AT, OpenPoints, Points, pack, pack_one, points_of_rows,
                                  preview, split_chunks, unpack)
from runs.tracking.metric_names import metric_name_shown, points_by_series
from runs.tracking.system_series import SYSTEM_PREFIX, SYSTEM_SPLIT
from workers.contract.errors import InputError
from runs.tracking.models import MetricChunk, MetricSeries
from runs.tracking import signals


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


def _closes(series: MetricSeries, points: Points) -> bool:
    """Whether these new points make the series' open chunks due to be merged (see _append)."""
    return series.open_points + len(points) >= CHUNK_POINTS or series.open_chunks + 1 >= MERGE_AT


def _chunks_insert(chunks: list[dict]) -> None:
    """New chunks (each its MetricChunk fields, series_id included) in one statement. On PostgreSQL one INSERT with
    the arrays as binary parameters (%b), through a cursor binding on the server: where an INSERT of Django's sent
    each as hex text inside the query (twice the bytes, parsed back by the server), and COPY took two round trips
    (issue 40); elsewhere (SQLite, the demo) bulk_create."""
    if not chunks:
        return
    if connection.vendor != "postgresql":
        MetricChunk.objects.bulk_create([MetricChunk(**fields) for fields in chunks])
        return
    attnames = _chunk_columns()[0]
    with server_cursor() as cursor:  # sizes that recur seldom (a resent step, a truncation): not prepared
        for part in _slices(chunks, PARAMETERS_MAX // len(attnames)):
            cursor.execute(_chunks_insert_sql(len(part)), [fields[name] for fields in part for name in attnames])


# PostgreSQL's most parameters in one statement (its protocol counts them in 16 bits).
PARAMETERS_MAX = 65_535


def _slices(rows: list, size: int) -> list[list]:
    return [rows[at:at + size] for at in range(0, len(rows), size)]


@lru_cache(maxsize=1)
def _chunk_columns() -> tuple[list[str], list[str]]:
    """The fields a chunk's INSERT writes and their database types (looked up once, not per batch)."""
    fields = [f for f in MetricChunk._meta.concrete_fields if not f.primary_key]
    return [f.attname for f in fields], [f.db_type(connection) for f in fields]


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


# The open points of the series this process wrote last (runs.tracking.chunks.OpenPoints): a merge writes the full
# chunk from there instead of reading back the open chunks it rewrites (issue 40). A worker writes a few dozen
# series, up to CHUNK_POINTS points each (128 KB at most).
_open = OpenPoints(256)


def _open_known(series: MetricSeries) -> Points | None:
    """The series' open points without a read: none open, or as this process left them; None when unknown."""
    if series.open_points == 0 and series.open_chunks == 0:
        return Points.empty()
    return _open.get(series.pk, getattr(series, "row_version", None), series.open_points)


def _open_read(series_ids: list[int]) -> dict[int, Points]:
    """The open chunks' points of these series, read back (in one query)."""
    parts = defaultdict(list)
    for series_id, *columns in MetricChunk.objects.filter(series_id__in=series_ids, num_points__lt=CHUNK_POINTS).order_by(
            "series_id", "last_step").values_list("series_id", *COLUMNS):
        parts[series_id].append(unpack(dict(zip(COLUMNS, columns))))
    return {series_id: Points.concat(parts[series_id]) for series_id in series_ids}


def _batch_write(*, new: list[tuple[MetricSeries, Points]], series: list[MetricSeries], training_run_id: int,
                 bump: bool) -> None:
    """A batch's writes: each series' new points in a chunk of their own (an INSERT costs what it adds; appending
    to a stored chunk rewrites all of it) until its open chunks (the last ones, not yet full) hold a chunk's worth
    or MERGE_AT of them pile up; then they and the new points are written again as full chunks plus an open tail.
    The open points come from this process's memory where it knows them (_open_known), else are read back.

    On PostgreSQL one prepared statement (_batch_sql) through a cursor binding on the server: the merged series'
    open chunks deleted, every new chunk inserted, the run's change counters bumped when `bump` (the batch's
    transaction is the outermost), the summaries updated: 1.15x the points/s of a statement each
    (bench/tracker/ingest_ab.py; sending those together in psycopg's pipeline mode had measured 1.01x). Elsewhere
    (SQLite, the demo) the ORM's, and no memory of open points (no row version to check it against)."""
    known = {row.pk: _open_known(row) for row, _ in new}
    unknown = [row.pk for row, points in new if known[row.pk] is None and _closes(row, points)]
    if unknown:  # another process (or transaction) wrote these last: their open chunks are read back
        known.update(_open_read(unknown))
    chunks, merged, kept = [], [], {}
    for row, points in new:
        if _closes(row, points):
            pieces = split_chunks(Points.concat([known[row.pk], points]), 0)
            tail = pieces[-1] if len(pieces[-1]) < CHUNK_POINTS else Points.empty()
            row.open_points, row.open_chunks = len(tail), int(len(tail) > 0)
            merged.append(row.pk)
            kept[row.pk] = tail
        else:
            pieces = [points]
            row.open_points += len(points)
            row.open_chunks += 1
            if known[row.pk] is not None:
                kept[row.pk] = Points.concat([known[row.pk], points])
        chunks.extend({"series_id": row.pk, **_chunk_fields(piece)} for piece in pieces)
    if connection.vendor != "postgresql":
        MetricChunk.objects.filter(series_id__in=merged, num_points__lt=CHUNK_POINTS).delete()
        _chunks_insert(chunks)
        _summaries_write(series)
        return
    attnames = _chunk_columns()[0]
    summaries = [value for row in series for value in (row.pk, *(getattr(row, f) for f in _SUMMARY_FIELDS))]
    params = [*([merged] if merged else []), *(fields[name] for fields in chunks for name in attnames),
              *([training_run_id] if bump else []), *summaries]
    if len(params) <= PARAMETERS_MAX:
        with server_cursor(prepare=True) as cursor:
            cursor.execute(_batch_sql(len(chunks), len(series), merged=bool(merged), bump=bump), params)
            versions = dict(cursor.fetchall())
    else:  # thousands of series in one batch: the same writes, each in as few statements as the limit allows
        with server_cursor() as cursor:
            if merged:
                cursor.execute(_OPEN_DELETE_SQL, [merged])
        _chunks_insert(chunks)
        versions, width = {}, 1 + len(_SUMMARY_FIELDS)
        with server_cursor() as cursor:
            for part in _slices(summaries, PARAMETERS_MAX // width * width):
                cursor.execute(_summaries_sql(len(part) // width) + ' RETURNING s."id", s."xmin"::text', part)
                versions.update(cursor.fetchall())
            if bump:
                cursor.execute(curves_bump_sql(), [training_run_id])
    for series_id, points in kept.items():
        _open.keep(series_id, versions[series_id], points)


_OPEN_DELETE_SQL = (f'DELETE FROM "{MetricChunk._meta.db_table}" WHERE "series_id" = ANY(%s) '
                    f'AND "num_points" < {CHUNK_POINTS}')


@lru_cache(maxsize=64)
def _batch_sql(chunks: int, series: int, *, merged: bool, bump: bool) -> str:
    """_batch_write's writes as one statement (one round trip, one plan): the merged series' open chunks deleted,
    the new chunks inserted, the run's change counters bumped (curves_bump_sql), the summaries updated, answering
    each series' new row version. PostgreSQL runs the parts in an order of its own, all on the snapshot from before
    the statement, so the delete leaves the chunks it inserts alone. The statement is the transaction's last before
    its commit, and the series' rows (and so their chunks) are already locked: once it holds the run's row, it waits
    for no other transaction's lock."""
    parts = ([f"deleted AS ({_OPEN_DELETE_SQL})"] if merged else []) + \
        ([f"inserted AS ({_chunks_insert_sql(chunks)})"] if chunks else []) + \
        ([f"bumped AS ({curves_bump_sql()})"] if bump else [])
    summaries = _summaries_sql(series) + ' RETURNING s."id", s."xmin"::text'
    return f"WITH {', '.join(parts)} {summaries}" if parts else summaries


@lru_cache(maxsize=16)
def _chunks_insert_sql(rows: int) -> str:
    """_chunks_insert's INSERT of `rows` chunks: the arrays as binary parameters (%b)."""
    attnames, types = _chunk_columns()
    columns = ", ".join(f'"{MetricChunk._meta.get_field(name).column}"' for name in attnames)
    row = "(" + ", ".join("%b" if t == "bytea" else "%s" for t in types) + ")"
    return f'INSERT INTO "{MetricChunk._meta.db_table}" ({columns}) VALUES {", ".join([row] * rows)}'


# Every field in the model's order, then the row's version (xmin), which tells whether this process's memory of the
# series' open points holds (_open_known).
_SERIES_FIELDS = [f.attname for f in MetricSeries._meta.concrete_fields]
_SERIES_COLUMNS = ", ".join(f'"{f.column}"' for f in MetricSeries._meta.concrete_fields)
_LOCKED_SQL = (f'SELECT {_SERIES_COLUMNS}, "xmin"::text '
               f'FROM "{MetricSeries._meta.db_table}" WHERE "training_run_id" = %s AND "key" = ANY(%s) '
               'ORDER BY "split", "key" FOR UPDATE')


def series_locked(*, training_run_id: int, names: list[tuple[str, str]]) -> dict[tuple[str, str], MetricSeries]:
    """The batch's series of the run, locked, made first where missing: one query when all exist (every
    batch but a series' first), three otherwise."""
    wanted = set(names)
    keys = sorted({key for _, key in names})

    def locked():
        if connection.vendor == "postgresql":  # the ORM's compiling and raw()'s mapping were a fifth of a batch's Python
            with server_cursor(prepare=True) as cursor:
                cursor.execute(_LOCKED_SQL, [training_run_id, keys])
                rows = []
                for *values, version in cursor.fetchall():
                    rows.append(MetricSeries.from_db(connection.alias, _SERIES_FIELDS, values))
                    rows[-1].row_version = version
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


def points_append(*, training_run_id: int, new: list[tuple[MetricSeries, Points]], series: list[MetricSeries],
                  bump: bool) -> None:
    """The one append of points after their series' last step, the workers' (metrics_record) and the API's
    (runs.tracking.reported_points): `new`, each series' points (after its last step, in order; summaries updated
    here); `series`, the locked rows (series_locked) whose summaries are written, `new`'s and any a caller changed.
    _batch_write's statements, the run's counters bumped last on PostgreSQL where `bump` (the caller's transaction
    the outermost; else the caller calls curves_changed)."""
    for row, points in new:
        _summary_update(row, points)
    _batch_write(new=new, series=series, training_run_id=training_run_id, bump=bump)


def series_chunks_replace(series: MetricSeries, *, chunk_ids: list[int], points: Points) -> None:
    """Replace a locked series' chunks from one on (the open ones are the last) by `points` in full chunks and an
    open tail, its summary recomputed from what is stored: a client's resent step (runs.tracking.reported_points),
    a resumed training's truncation (metrics_truncate).
    This process's memory of its open points is dropped: the next merge reads them back, once."""
    MetricChunk.objects.filter(pk__in=chunk_ids).delete()
    _chunks_insert([{"series_id": series.pk, **_chunk_fields(p)} for p in split_chunks(points, 0)])
    _summary_rebuild(series)  # forgets the open points; recounts the open chunks and every field from the chunks


def metrics_record(*, training_run_id: int, points: list[dict]) -> int:
    """Append points ({split, key, step, epoch, value[, time]}) to their series; how many were kept.

    A point whose step is not after its series' last step is refused and counted on the series
    (`num_refused`, shown with the curve): curves never hold two values for one step. A key that is not
    a metric name (runs.tracking.metric_names) stores nothing of the batch: our trainers never write one,
    so it is a bug to see, not a curve to keep.

    A batch costs the same few queries whatever its series (tests/curves/test_write_queries.py): the series
    locked in one read, then points_append's. A batch that is not its own transaction (a caller's holds it) leaves
    the counters' bump to after that commits, once however many batches it writes. A loss series' first
    non-finite value is found in the batch's own arrays, and only then are the run's loss_nan rules asked."""
    bump_inside = connection.vendor == "postgresql" and not transaction.get_connection().in_atomic_block
    with transaction.atomic():
        return _record(training_run_id, points, bump_inside=bump_inside)


def _record(training_run_id: int, points: list[dict], *, bump_inside: bool) -> int:
    by_series = points_by_series(points)
    if not by_series:
        return 0
    series_of = series_locked(training_run_id=training_run_id, names=list(by_series))
    now, kept, new_points, went_bad = time.time(), 0, [], None
    for name, rows in sorted(by_series.items()):
        series = series_of[name]
        new = points_of_rows(rows, now)
        refused = len(rows) - len(new)  # repeated steps within the batch
        if series.last_step is not None:
            later = new.steps > series.last_step
            refused += int((~later).sum())
            new = new.take(later)
        if len(new):
            new_points.append((series, new))
            kept += len(new)
            if went_bad is None and not series.num_non_finite and "loss" in series.key:  # finite so far
                at = int(np.argmax(~np.isfinite(new.values)))
                if not math.isfinite(new.values[at]):
                    went_bad = {"split": series.split, "key": series.key, "step": int(new.steps[at]),
                                "value": float(new.values[at])}
        series.num_refused += refused
    points_append(training_run_id=training_run_id, new=new_points, series=list(series_of.values()), bump=bump_inside)
    if not bump_inside:
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
        series_chunks_replace(series, chunk_ids=[c.pk for c in chunks], points=kept)
    MetricSeries.objects.filter(training_run_id=training_run_id, num_points=0).delete()
    if removed:
        curves_changed(training_run_id=training_run_id)
    return removed


def _summary_rebuild(series: MetricSeries) -> None:
    _open.forget(series.pk)  # its chunks were rewritten: what this process kept of them no longer holds
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
