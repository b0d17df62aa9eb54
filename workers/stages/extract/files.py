"""The extract stage's files: one batch of captured layers, checked and written one file per row.

Split from workers.stages.extract.with_transformers (which re-exports these) to keep each module readable.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch


class HiddenBatch(NamedTuple):
    indices: list[int]  # dataset row indices, which are also the file indices
    rows: list[list[int]]  # their input_ids, unpadded
    hidden: torch.Tensor  # [B, T, L, H] STORE_DTYPE on the CPU, T the longest row's length
    forward_seconds: float  # forward plus the copy to the CPU, which waits for the device


def _check_batch(batch: HiddenBatch) -> None:
    """speculators' check_hidden_states for every row of the batch, run row by row only when the
    batch as a whole (padding included) is not all finite: the rows' token ids and shapes hold by
    construction, and one pass over the batch costs far less than a list and two passes per row."""
    lo, hi = torch.aminmax(batch.hidden)  # NaN propagates; several times faster than isfinite().all()
    if bool(torch.isfinite(torch.stack((lo, hi))).all()):
        return
    from speculators.data_generation.offline import check_hidden_states

    for b, (i, row) in enumerate(zip(batch.indices, batch.rows)):
        payload = {"token_ids": torch.tensor(row, dtype=torch.long), "hidden_states": batch.hidden[b, : len(row)]}
        try:
            check_hidden_states(payload, row)
        except ValueError as exc:
            raise ValueError(f"hs_{i}.safetensors: {exc}") from None


class _InlineWriter:
    """The executor interface, writing at once in the caller's thread."""

    def submit(self, fn, *args) -> Future:
        future = Future()
        future.set_result(fn(*args))
        return future

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _writer(device: torch.device):
    """Where files are written. On the CPU the forward already keeps every core busy and a writer
    thread only slows it down (demo target on 2 cores: forwards 0.65 s -> 0.95 s, more than the
    writes it hid); an accelerator idles while the host writes, so there one thread overlaps them."""
    if device.type == "cpu":
        return _InlineWriter()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract-writer")


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
