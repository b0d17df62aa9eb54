"""How a stage's rows are split among the workers that share it (issue 36), without Django.

A shardable stage (prepare, extract, regenerate, evaluate) numbers its rows in the order one worker
would do them. A shard is a contiguous range of those row numbers; each worker does its range into a
folder of its own (`shard_dir`), and the stage's merge puts the parts together in shard order, so the
outputs are exactly what one worker would have made. Contiguous ranges, not round-robin: a merge that
concatenates in order then needs no re-sorting, and a shard's rows read as one span on its page.
"""
from __future__ import annotations

from pathlib import Path

# Fewer rows than this per shard costs more in model loads than it saves (issue 36: "at most one per 64 rows").
MIN_ROWS_PER_SHARD = 64


def spans_split(total_rows: int, shards: int) -> list[range]:
    """`shards` contiguous ranges covering 0..total_rows, sizes differing by at most one, the larger first.
    Never an empty range: asking for more shards than rows gives one shard per row."""
    if total_rows < 0:
        raise ValueError(f"total_rows must be at least 0, not {total_rows}")
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    shards = max(1, min(shards, total_rows))
    base, extra = divmod(total_rows, shards)
    spans, start = [], 0
    for index in range(shards):
        stop = start + base + (1 if index < extra else 0)
        spans.append(range(start, stop))
        start = stop
    return spans


def shards_default(*, total_rows: int, live_workers: int) -> int:
    """Left out by the user: one shard per live worker that takes the stage's queue, at most one per
    MIN_ROWS_PER_SHARD rows, and at least one."""
    return max(1, min(live_workers, total_rows // MIN_ROWS_PER_SHARD))


def shard_dir(stage_dir: Path, index: int) -> Path:
    """Where shard `index` of a stage writes its part, inside the stage's own folder."""
    return Path(stage_dir) / "shards" / f"{index:05d}"
