"""How a curve's points are kept: per series (training run, split, key), in chunks of up to
CHUNK_POINTS points, each column one little-endian array.

A row per point made a million-point curve a million rows to read for every chart; a chunk holds
thousands, so the whole curve is a few hundred rows and one numpy concatenation away.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from itertools import repeat
from operator import contains, itemgetter

import numpy as np

CHUNK_POINTS = 4096
# Chunks not yet full (the newest of a series) are merged once this many pile up: a worker that
# flushes a few points at a time leaves a short tail for readers, not thousands of tiny rows.
MERGE_AT = 32
COLUMNS = {"steps": "<i8", "epochs": "<f8", "values": "<f8", "times": "<f8"}


@dataclass
class Points:
    """Parallel arrays, ascending by step: the step, the epoch (fractional), the value and the
    wall-clock time (Unix seconds) the worker recorded it."""

    steps: np.ndarray
    epochs: np.ndarray
    values: np.ndarray
    times: np.ndarray

    @classmethod
    def empty(cls) -> "Points":
        return cls(**{name: np.empty(0, dtype=dtype) for name, dtype in COLUMNS.items()})

    @classmethod
    def concat(cls, parts: list["Points"]) -> "Points":
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in COLUMNS})

    def __len__(self) -> int:
        return len(self.steps)

    def take(self, index) -> "Points":
        return Points(**{name: getattr(self, name)[index] for name in COLUMNS})

    def window(self, start: int | None, end: int | None) -> "Points":
        lo = 0 if start is None else int(np.searchsorted(self.steps, start, side="left"))
        hi = len(self) if end is None else int(np.searchsorted(self.steps, end, side="right"))
        return self.take(slice(lo, hi))


def points_of_rows(rows: list[dict], now: float) -> Points:
    """The rows ({step, epoch, value[, time]}) of one series as arrays, ascending by step; a step given twice keeps
    its last value; a row without a time (or 0) takes `now`."""
    n = len(rows)

    def column(name: str, dtype) -> np.ndarray:  # straight from the dicts: no tuple per point
        return np.fromiter(map(itemgetter(name), rows), dtype=dtype, count=n)

    steps = column("step", np.int64)  # exact even past 2**53
    if any(map(contains, rows, repeat("time"))):
        times = np.fromiter([r.get("time") or now for r in rows], dtype=np.float64, count=n)
    else:  # a worker's points leave the time to the write: no Python loop for it
        times = np.full(n, now, dtype=np.float64)
    points = Points(steps=steps, epochs=column("epoch", np.float64), values=column("value", np.float64), times=times)
    if n > 1 and not (steps[1:] > steps[:-1]).all():  # a worker's batch is in order already
        points = points.take(np.argsort(steps, kind="stable"))
        keep = np.ones(n, dtype=bool)
        keep[:-1] = points.steps[1:] != points.steps[:-1]  # of equal steps, the last one written wins
        points = points.take(keep)
    return points


def pack(points: Points) -> dict[str, bytes]:
    return {name: np.ascontiguousarray(getattr(points, name), dtype=dtype).tobytes() for name, dtype in COLUMNS.items()}


def unpack(columns: dict[str, bytes]) -> Points:
    return Points(**{name: np.frombuffer(bytes(columns[name]), dtype=dtype) for name, dtype in COLUMNS.items()})


def split_chunks(points: Points, room_in_open: int) -> list[Points]:
    """The first piece fills what the open chunk has room for; the rest are full chunks and a tail."""
    pieces, start = [], 0
    if room_in_open > 0:
        pieces.append(points.take(slice(0, room_in_open)))
        start = room_in_open
    while start < len(points):
        pieces.append(points.take(slice(start, start + CHUNK_POINTS)))
        start += CHUNK_POINTS
    return [p for p in pieces if len(p)]


class OpenPoints:
    """The points of series' open chunks (the last ones, not yet full) as this process last wrote them, by series
    id, with the version of the series' row that write left (runs.tracking.services: PostgreSQL's xmin, which any
    later write of the row moves). A version or a count that differs says another writer came since: unknown.
    At most `size` series; the one kept longest ago goes first. Shared by the process's threads (a worker's
    system sampler writes beside its training), so changed under a lock."""

    def __init__(self, size: int):
        self.size, self.kept, self.lock = size, {}, threading.Lock()

    def get(self, series_id: int, version: str | None, count: int) -> Points | None:
        kept = self.kept.get(series_id)
        if kept is None or version is None or kept[0] != version or len(kept[1]) != count:
            return None
        return kept[1]

    def keep(self, series_id: int, version: str, points: Points) -> None:
        with self.lock:
            self.kept.pop(series_id, None)
            if len(self.kept) >= self.size:
                del self.kept[next(iter(self.kept))]
            self.kept[series_id] = (version, points)

    def forget(self, series_id: int) -> None:
        with self.lock:
            self.kept.pop(series_id, None)

    def clear(self) -> None:
        with self.lock:
            self.kept.clear()


PREVIEW_BUCKETS = 64


def preview(points: Points) -> Points:
    """The lowest and highest finite point of each of PREVIEW_BUCKETS slices of a chunk, plus its
    first and last: what MinMaxLTTB would keep from it for any chart of fewer points than that, so
    a whole-curve chart reads these instead of every point and still shows every spike."""
    finite = points.take(np.isfinite(points.values))
    n = len(finite)
    if n <= 2 * PREVIEW_BUCKETS + 2:
        return finite
    if n % PREVIEW_BUCKETS == 0:  # a full chunk of finite values: equal slices, found at once (the loop's answer)
        size = n // PREVIEW_BUCKETS
        slices, starts = finite.values.reshape(PREVIEW_BUCKETS, size), np.arange(0, n, size)
        return finite.take(np.unique(np.concatenate([[0, n - 1], starts + slices.argmin(axis=1),
                                                     starts + slices.argmax(axis=1)])))
    bounds = np.linspace(0, n, PREVIEW_BUCKETS + 1).astype(np.int64)
    keep = [0, n - 1]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi > lo:
            part = finite.values[lo:hi]
            keep += [lo + int(part.argmin()), lo + int(part.argmax())]
    return finite.take(np.unique(np.asarray(keep, dtype=np.int64)))


def pack_one(points: Points) -> bytes:
    """All four columns in one blob (steps, epochs, values, times, each len(points) long)."""
    return b"".join(pack(points).values())


def unpack_one(blob: bytes) -> Points:
    blob = bytes(blob)
    n = len(blob) // (8 * len(COLUMNS))
    parts = {name: np.frombuffer(blob, dtype=dtype, count=n, offset=i * 8 * n)
             for i, (name, dtype) in enumerate(COLUMNS.items())}
    return Points(**parts)


def downsample(points: Points, n_out: int) -> Points:
    """At most n_out points, chosen by MinMaxLTTB over (step, value); non-finite values are left out
    of charts (they are counted on the series and kept in exports)."""
    points = points.take(np.isfinite(points.values))
    if len(points) <= n_out:
        return points
    from tsdownsample import MinMaxLTTBDownsampler

    index = MinMaxLTTBDownsampler().downsample(points.steps, points.values, n_out=max(n_out, 3))
    return points.take(np.asarray(index, dtype=np.int64))
