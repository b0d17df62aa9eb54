"""How a curve's points are kept: per series (training run, split, key), in chunks of up to
CHUNK_POINTS points, each column one little-endian array.

A row per point made a million-point curve a million rows to read for every chart; a chunk holds
thousands, so the whole curve is a few hundred rows and one numpy concatenation away.
"""
from __future__ import annotations

from dataclasses import dataclass

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


PREVIEW_BUCKETS = 64


def preview(points: Points) -> Points:
    """The lowest and highest finite point of each of PREVIEW_BUCKETS slices of a chunk, plus its
    first and last: what MinMaxLTTB would keep from it for any chart of fewer points than that, so
    a whole-curve chart reads these instead of every point and still shows every spike."""
    finite = points.take(np.isfinite(points.values))
    n = len(finite)
    if n <= 2 * PREVIEW_BUCKETS + 2:
        return finite
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
