"""The extract stage's files: one batch of captured layers, checked and written one file per row.

Split from workers.stages.extract.with_transformers to keep each module readable.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from workers.stages.extract.output.writer import BoundedWriter

if TYPE_CHECKING:
    from workers.stages.extract.host_copy import StagedBatch

# Batches handed to the writer thread and not yet written (the one it writes included): enough to
# ride out one slow write, few enough that their host memory (pinned buffers on CUDA) stays small.
WRITES_IN_FLIGHT = 3


class HiddenBatch(NamedTuple):
    indices: list[int]  # dataset row indices, which are also the file indices
    rows: list[list[int]]  # their input_ids, unpadded
    hidden: torch.Tensor  # [B, T, L, H] STORE_DTYPE on the CPU, T the longest row's length
    forward_seconds: float  # forward plus the copy to the CPU, which waits for the device


def _check_batch(batch: HiddenBatch, extremes: torch.Tensor | None = None) -> None:
    """speculators' check_hidden_states for every row of the batch, run row by row only when the
    batch as a whole (padding included) is not all finite: the rows' token ids and shapes hold by
    construction, and one pass over the batch costs far less than a list and two passes per row.
    `extremes`: the batch's (min, max) when the device already computed them (PinnedCopies)."""
    if extremes is None:
        extremes = torch.stack(torch.aminmax(batch.hidden))  # NaN propagates; faster than isfinite().all()
    if bool(torch.isfinite(extremes).all()):
        return
    from speculators.data_generation.offline import check_hidden_states

    for b, (i, row) in enumerate(zip(batch.indices, batch.rows)):
        payload = {"token_ids": torch.tensor(row, dtype=torch.long), "hidden_states": batch.hidden[b, : len(row)]}
        try:
            check_hidden_states(payload, row)
        except ValueError as exc:
            raise ValueError(f"hs_{i}.safetensors: {exc}") from None


class _InlineWriter(Executor):
    """The executor interface, writing at once in the caller's thread (whose exceptions it raises)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _writer(threaded: bool) -> Executor:
    """Where files are written: inline in the forward loop, or on a BoundedWriter thread that overlaps
    them with the next forwards (at most WRITES_IN_FLIGHT batches behind; its first error stops the
    stage). extract() picks the thread on CUDA and inline on the CPU, where the forward already keeps
    every core busy and a writer thread only slows it down (demo target on 2 cores: forwards 0.65 s ->
    0.95 s, more than the writes it hid)."""
    return BoundedWriter(WRITES_IN_FLIGHT) if threaded else _InlineWriter()


def _write_staged(hs_dir: Path, staged: StagedBatch) -> tuple[int, float]:
    """(bytes written, seconds checking and writing) for a staged batch, once its copy is done; run on
    the writer (which may be the forward loop itself). The wait for the copy is not counted."""
    staged.wait()
    t0 = time.perf_counter()
    batch = HiddenBatch(staged.indices, staged.rows, staged.host, 0.0)
    _check_batch(batch, staged.extremes)
    written = _write_batch(hs_dir, batch)
    return written, time.perf_counter() - t0


def _write_batch(hs_dir: Path, batch: HiddenBatch) -> int:
    """Bytes written: one hs_{i}.safetensors per row, each complete or absent (temp file + rename)."""
    from safetensors.torch import save_file

    written = 0
    for b, (i, row) in enumerate(zip(batch.indices, batch.rows)):
        path = hs_dir / f"hs_{i}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        payload = {
            "token_ids": torch.tensor(row, dtype=torch.long),
            "hidden_states": batch.hidden[b, : len(row)].contiguous(),  # a view already: no copy
        }
        save_file(payload, str(tmp))
        os.replace(tmp, path)
        written += path.stat().st_size
    return written
