"""Curves a trainer elsewhere reports through the API (runs.pipeline.launch.external): checked whole before
anything is stored, and idempotent by step, so that a client that retries a batch never doubles a point.

A point whose (key, split, step) is stored already with the same value is left as it is (`unchanged`),
with another value it replaces it (`replaced`); any other point is added (`accepted`). Points after a
series' last step are appended as the workers' write path appends them (runs.tracking.services); a
point at or before it (a resent or corrected batch) rewrites the chunks from its step on, and the
series' summary is recomputed from what is stored.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from django.db import transaction
from django.db.models import Q

from runs.tracking.models import MetricSeries
from runs.pipeline.status.changes import curves_changed
from runs.tracking.chunks import CHUNK_POINTS, COLUMNS, Points, points_of_rows, unpack
from runs.tracking.metric_names import RULE, is_metric_name, metric_name_shown
from runs.tracking.services import points_append, series_chunks_replace, series_locked
from workers.contract.errors import InputError

MAX_POINTS = 10_000
SPLITS = ("train", "val")  # the splits the curves API and the run page read (runs.tracking.curve_api)
POINT_FIELDS = ("key", "split", "step", "value", "epoch")
# Bounds a report's numbers must keep: a step past 2**53 is not exact in the pages' JavaScript (nor in
# a float64 export), and no training runs a million epochs (a probe stored an epoch of 2**63).
MAX_STEP = 2**53
MAX_EPOCH = 1_000_000


class PointError(InputError):
    """A point of a batch that cannot be stored; `field` names it as the body does (points[3].value)."""

    def __init__(self, message: str, *, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class PointCounts:
    accepted: int
    unchanged: int
    replaced: int


def _number(value, *, field: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PointError(f"{field} must be a number ({what}), got {type(value).__name__} {str(value)[:40]!r}",
                         field=field)
    if not math.isfinite(value):
        raise PointError(f"{field} must be a finite number ({what}), got {value}", field=field)
    return float(value)


def points_check(points: object) -> list[dict]:
    """The batch as {key, split, step, value, epoch} dicts; PointError naming the first bad point's field."""
    if not isinstance(points, list):
        raise PointError(f"points must be a list of points, got {type(points).__name__}", field="points")
    if not points:
        raise PointError("points is empty: send at least one {key, split, step, value}", field="points")
    if len(points) > MAX_POINTS:
        raise PointError(f"points holds {len(points):,} points; at most {MAX_POINTS:,} per batch (send several)",
                         field="points")
    checked, seen = [], {}
    for i, point in enumerate(points):
        at = f"points[{i}]"
        if not isinstance(point, dict):
            raise PointError(f"{at} must be an object {{key, split, step, value}}, got {type(point).__name__}",
                             field=at)
        unknown = sorted(set(point) - set(POINT_FIELDS))
        if unknown:
            raise PointError(f"{at}.{unknown[0][:40]} is not a field of a point (known: {', '.join(POINT_FIELDS)})",
                             field=f"{at}.{unknown[0][:40]}")
        for name in ("key", "split", "step", "value"):
            if name not in point:
                raise PointError(f"{at}.{name} is missing", field=f"{at}.{name}")
        key = point["key"]
        if not is_metric_name(key):
            raise PointError(f"{at}.key must be a metric name ({RULE}: loss_0, full_acc_0, ...), got "
                             f"{metric_name_shown(key)}", field=f"{at}.key")
        if point["split"] not in SPLITS:
            raise PointError(f"{at}.split must be one of {', '.join(SPLITS)}, got {str(point['split'])[:40]!r}",
                             field=f"{at}.split")
        step = point["step"]
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise PointError(f"{at}.step must be a whole number from 0 to {MAX_STEP:,}, got {str(step)[:40]!r}",
                             field=f"{at}.step")
        value = _number(point["value"], field=f"{at}.value", what="NaN and infinities are not stored")
        epoch = _number(point.get("epoch", 0), field=f"{at}.epoch", what="the fractional epoch; 0 when omitted")
        if not 0 <= epoch <= MAX_EPOCH:
            raise PointError(f"{at}.epoch must be from 0 to {MAX_EPOCH:,}, got {epoch}", field=f"{at}.epoch")
        identity = (key, point["split"], step)
        if identity in seen:
            raise PointError(f"{at}.step repeats step {step} of {point['split']} {key} given by "
                             f"points[{seen[identity]}] in this batch: send each step once", field=f"{at}.step")
        seen[identity] = i
        checked.append({"key": key, "split": point["split"], "step": step, "value": value, "epoch": epoch})
    return checked


def _rewrite_from(series: MetricSeries, new: Points) -> tuple[int, int, int]:
    """Merge `new` into the stored points from its first step on: (accepted, unchanged, replaced)."""
    # From the first chunk it reaches, and every chunk not yet full (always the last ones), so that the
    # chunks written stay in step order with the open ones last, as the append path expects.
    chunks = list(series.chunks.filter(Q(last_step__gte=int(new.steps[0])) | Q(num_points__lt=CHUNK_POINTS))
                  .order_by("first_step"))
    stored = Points.concat([unpack({name: getattr(c, name) for name in COLUMNS}) for c in chunks])
    index = {int(step): i for i, step in enumerate(stored.steps.tolist())}
    accepted = unchanged = replaced = 0
    changed_values = stored.values.copy()
    changed_epochs = stored.epochs.copy()
    changed_times = stored.times.copy()
    added = []
    for i, step in enumerate(new.steps.tolist()):
        at = index.get(int(step))
        if at is None:
            added.append(i)
            accepted += 1
        elif stored.values[at] == new.values[i] and stored.epochs[at] == new.epochs[i]:
            unchanged += 1
        else:
            changed_values[at], changed_epochs[at], changed_times[at] = new.values[i], new.epochs[i], new.times[i]
            replaced += 1
    if not accepted and not replaced:
        return 0, unchanged, 0
    merged = Points.concat([Points(steps=stored.steps, epochs=changed_epochs, values=changed_values, times=changed_times),
                            new.take(np.array(added, dtype=np.int64))])
    order = np.argsort(merged.steps, kind="stable")
    merged = merged.take(order)
    series_chunks_replace(series, chunk_ids=[c.pk for c in chunks], points=merged)
    return accepted, unchanged, replaced


@transaction.atomic(savepoint=False)  # a batch fails whole with its caller's transaction: no savepoint's 2 queries
def points_report(*, training_run_id: int, points: list[dict]) -> PointCounts:
    """Store a checked batch (points_check) on a training's curves, idempotent by step.

    Points after their series' last step (a client's every batch but a resent one) are appended by the workers'
    own write (runs.tracking.services.points_append), a fixed number of queries whatever the series
    (tests/curves/test_write_queries.py): the series locked in one read, their new chunks in one insert, their
    summaries in one update, a merge's open points from this process's memory where it holds. A series with a
    point at or before its last step is rewritten on its own (_rewrite_from). The run's change counters move once
    the caller's transaction commits (runs.pipeline.launch.external holds it)."""
    by_series: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in points:
        by_series[(p["split"], p["key"])].append(p)
    series_of = series_locked(training_run_id=training_run_id, names=list(by_series))
    now = time.time()
    accepted = unchanged = replaced = 0
    appended = []
    for name, rows in sorted(by_series.items()):
        series = series_of[name]
        new = points_of_rows(rows, now)  # points_check let no step twice into a batch
        if series.last_step is None or int(new.steps[0]) > series.last_step:
            appended.append((series, new))
            accepted += len(new)
            continue
        added, same, changed = _rewrite_from(series, new)
        accepted, unchanged, replaced = accepted + added, unchanged + same, replaced + changed
    if appended:
        points_append(training_run_id=training_run_id, new=appended, series=[row for row, _ in appended], bump=False)
    if accepted or replaced:
        # live pages' polls see the points (runs.pipeline.status.changes)
        curves_changed(training_run_id=training_run_id)
    return PointCounts(accepted=accepted, unchanged=unchanged, replaced=replaced)
