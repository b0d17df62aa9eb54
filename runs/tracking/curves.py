"""Reads of training curves: chart windows downsampled so spikes survive, full series for export,
and per-series summaries for lists and comparisons.

A chart asks for at most N points per series over a step window. Chunks wholly inside a window
too dense for N points are read through their previews (min and max of each slice, see
runs.tracking.chunks.preview); the rest are read whole. What was read is then reduced to N points
with MinMaxLTTB (tsdownsample), which keeps the extremes that a spike is made of.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.http import Http404

from runs.tracking.chunks import CHUNK_POINTS, Points, downsample, unpack, unpack_one
from runs.projects.visible_run import visible_run_row
from runs.tracking.models import MetricChunk, MetricSeries
from runs.tracking.system_series import SYSTEM_SPLIT

DEFAULT_POINTS = 2000
MAX_POINTS = 20000
MAX_KEYS = 64
# A preview keeps about 1/32 of its chunk (every slice's min and max): a window holding more than 32x
# the points asked for still gets more candidates than that from the previews of the chunks wholly
# inside it, and reads those (a few KB a chunk) instead of the chunks (128 KB each).
PREVIEW_FACTOR = 32
COLUMN_NAMES = ("steps", "epochs", "values", "times")  # a window's columns, in its answer's order


@dataclass(frozen=True)
class CurveQuery:
    keys: tuple[str, ...] = ()  # empty: every key
    split: str = ""  # empty: every split
    start: int | None = None
    end: int | None = None
    points: int = DEFAULT_POINTS


def _chunks(series_ids: list[int], query: CurveQuery):
    chunks = MetricChunk.objects.filter(series_id__in=series_ids)
    if query.start is not None:
        chunks = chunks.filter(last_step__gte=query.start)
    if query.end is not None:
        chunks = chunks.filter(first_step__lte=query.end)
    return chunks.order_by("series_id", "last_step")


def _inside(chunk_first: int, chunk_last: int, query: CurveQuery) -> bool:
    return (query.start is None or chunk_first >= query.start) and (query.end is None or chunk_last <= query.end)


def _window_points(series_ids: list[int], query: CurveQuery) -> dict[int, tuple[Points, int]]:
    """For each series: the points to downsample from, and how many points the window really holds.
    Three queries whatever the number of series (a page polls a dozen curves every few seconds)."""
    heads: dict[int, list[tuple]] = {pk: [] for pk in series_ids}
    for series_id, *head in _chunks(series_ids, query).values_list("series_id", "pk", "first_step", "last_step",
                                                                  "num_points"):
        heads[series_id].append(tuple(head))
    in_window = {sid: sum(n for *_, n in rows) for sid, rows in heads.items()}  # edge chunks overcount; see below
    # Only full chunks keep a preview (runs.tracking.services._chunk_fields); the open one is read whole.
    use_preview = {pk for sid, rows in heads.items() if in_window[sid] > PREVIEW_FACTOR * query.points
                   for pk, first, last, n in rows if n == CHUNK_POINTS and _inside(first, last, query)}
    whole_ids = [pk for rows in heads.values() for pk, *_ in rows if pk not in use_preview]
    parts: dict[int, Points] = {}
    if use_preview:
        for pk, blob in MetricChunk.objects.filter(pk__in=use_preview).values_list("pk", "preview"):
            parts[pk] = unpack_one(blob)
    if whole_ids:
        rows = MetricChunk.objects.filter(pk__in=whole_ids).values_list("pk", "series_id", "steps", "epochs",
                                                                         "values", "times")
        for pk, series_id, steps, epochs, values, times in rows:
            whole = unpack({"steps": steps, "epochs": epochs, "values": values, "times": times})
            windowed = whole.window(query.start, query.end)
            in_window[series_id] -= len(whole) - len(windowed)
            parts[pk] = windowed
    return {sid: (Points.concat([parts[pk] for pk, *_ in rows if pk in parts]), in_window[sid])
            for sid, rows in heads.items()}


def _number(value):
    return value if value is None or np.isfinite(value) else None


def series_summary(series: MetricSeries) -> dict:
    return {
        "split": series.split, "key": series.key, "num_points": series.num_points,
        "first_step": series.first_step, "last_step": series.last_step,
        "last": _number(series.last_value), "last_epoch": series.last_epoch,
        "min": _number(series.min_value), "min_step": series.min_step,
        "max": _number(series.max_value), "max_step": series.max_step,
        "num_non_finite": series.num_non_finite, "num_refused": series.num_refused,
    }


def curve_series(*, training_run_id: int, query: CurveQuery = CurveQuery()):
    """The series of the query's split; with none given, the training's curves (train and val), not the
    system series, whose steps are times (split "system": runs.tracking.system_series)."""
    series = MetricSeries.objects.filter(training_run_id=training_run_id).order_by("key", "split")
    if query.keys:
        series = series.filter(key__in=query.keys)
    if query.split:
        series = series.filter(split=query.split)
    else:
        series = series.exclude(split=SYSTEM_SPLIT)
    return series


def curve_window_columns(*, training_run_id: int, query: CurveQuery) -> list[dict]:
    """curve_window with its four columns left as numpy arrays (steps int64; epochs rounded to 6 decimals,
    values, times rounded to 3: float64), the last four keys: runs.tracking.curve_api writes them as JSON
    without a Python float per point."""
    out = []
    all_series = list(curve_series(training_run_id=training_run_id, query=query))
    windows = _window_points([series.pk for series in all_series], query)
    for series in all_series:
        raw, in_window = windows[series.pk]
        shown = downsample(raw, query.points)
        out.append({
            **series_summary(series),
            "points_in_window": int(in_window),
            "downsampled": len(shown) < in_window,
            "steps": shown.steps, "epochs": np.round(shown.epochs, 6),
            "values": shown.values, "times": np.round(shown.times, 3),
        })
    return out


def curve_window(*, training_run_id: int, query: CurveQuery) -> list[dict]:
    """Each matching series over the window: at most `query.points` points (step, epoch, value,
    time), how many the window holds, and the series' summary (its last step tells a live page
    where to ask from next)."""
    return [{name: value.tolist() if name in COLUMN_NAMES else value for name, value in series.items()}
            for series in curve_window_columns(training_run_id=training_run_id, query=query)]


def series_points(*, series: MetricSeries) -> Points:
    """Every point of a series, at full resolution, in one array per column (tests, small series)."""
    return Points.concat(list(series_chunks(series=series)))


def run_series_summaries(*, training_run_ids: list[int]) -> dict[int, list[dict]]:
    """Summaries of every curve of these training runs (not their system series), in one query (lists, compare)."""
    out: dict[int, list[dict]] = {pk: [] for pk in training_run_ids}
    for series in MetricSeries.objects.filter(training_run_id__in=training_run_ids).exclude(
            split=SYSTEM_SPLIT).order_by("key", "split"):
        out[series.training_run_id].append(series_summary(series))
    return out


def series_chunks(*, series: MetricSeries):
    """Every point of a series, chunk by chunk, without holding the curve in memory (exports)."""
    rows = series.chunks.order_by("last_step").values_list("steps", "epochs", "values", "times")
    for s, e, v, t in rows.iterator(chunk_size=16):
        yield unpack({"steps": s, "epochs": e, "values": v, "times": t})


@dataclass(frozen=True)
class CurveOwner:
    run_id: int
    training_run_id: int | None
    curve_changes: int = 0  # moves with every write to the curves (runs.pipeline.status.changes)


def curve_owner(*, run_id: int, user) -> CurveOwner:
    """The run whose curves are asked for, its training's id and its curves' change counter; Http404 when
    there is no such run or it is in a project the user does not see, in the same words (runs.projects.access).
    One query, compiled once (runs.projects.visible_run): a live chart polls every few seconds (issue 40)."""
    row = visible_run_row(run_id=run_id, user=user, fields=("pk", "training_run__pk", "curve_changes"))
    if row is None:
        raise Http404(f"no run {run_id}")
    return CurveOwner(*row)
