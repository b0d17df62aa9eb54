"""Bringing a batch's captured layers from the device to the host, for the extract stage's writer.

Two ways, one interface (`stage` a batch, `release` it once written, `close` for the device times):
- `BlockingCopies`: `.cpu()` into fresh pageable memory; the forward loop waits for the forward and
  the copy before it goes on. On the CPU there is nothing to copy at all.
- `PinnedCopies` (CUDA): the copy runs on a side stream into one of a few reused pinned buffers, with
  non_blocking=True, so that the next batch's forward is launched while it runs; the writer thread
  waits for the batch's copy-done event before it reads the buffer. Buffers are sized to the largest
  batch and at most `num_buffers` exist: pinned memory stays bounded, and a loop that finds none free
  waits for the writer (back-pressure).
Device time is read from CUDA events (`EventTimes`), never by synchronising inside the loop.
"""
from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import torch


class ForwardedBatch(NamedTuple):
    """One forward's output, as the forward generator yields it."""

    indices: list[int]  # dataset row indices, which are also the file indices
    rows: list[list[int]]  # their input_ids, unpadded
    hidden: torch.Tensor | None  # [B, T, L, H] in the stored dtype on the model's device; None without capture
    started: float  # time.perf_counter() just before the forward was launched
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None  # on CUDA: around the forward on its stream


@dataclass
class StagedBatch:
    """A batch on its way to the files: `host` may be read once `wait()` returned."""

    indices: list[int]
    rows: list[list[int]]
    host: torch.Tensor  # [B, T, L, H] on the host
    extremes: torch.Tensor | None  # (min, max) over `host`, computed on the device; None: not computed
    copied: torch.cuda.Event | None = None
    slot: int | None = None  # which pinned buffer `host` is a view of

    def wait(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()


class EventTimes:
    """Seconds between pairs of CUDA events, summed as they complete: adding never blocks, and the
    pairs still pending are those the device has not reached yet."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()

    def add(self, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        self._pending.append((start, end))
        self._collect(block=False)

    def total(self) -> float:
        self._collect(block=True)
        return self.seconds

    def _collect(self, block: bool) -> None:
        while self._pending and (block or self._pending[0][1].query()):
            start, end = self._pending.popleft()
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000.0


def _timed_events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


class BlockingCopies:
    """The synchronous way: the loop itself waits for the copy (and so for the forward)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.copy_times = EventTimes() if device.type == "cuda" else None
        self.wait_seconds = 0.0  # never waits for the writer: it holds no buffers

    def stage(self, batch: ForwardedBatch) -> StagedBatch:
        if self.copy_times is None:
            return StagedBatch(batch.indices, batch.rows, batch.hidden.cpu(), None)
        start, end = _timed_events()
        start.record()
        host = batch.hidden.cpu()
        end.record()
        self.copy_times.add(start, end)
        return StagedBatch(batch.indices, batch.rows, host, None)

    def release(self, staged: StagedBatch) -> None:
        return None

    def copy_seconds(self) -> float:
        """Device time in the copies (0 on the CPU, where the states already are in host memory)."""
        return self.copy_times.total() if self.copy_times is not None else 0.0


class PinnedCopies:
    """Side-stream copies into `num_buffers` reused pinned buffers of `capacity` elements each."""

    def __init__(self, device: torch.device, capacity: int, num_buffers: int, dtype: torch.dtype):
        self.device, self.capacity, self.dtype = device, capacity, dtype
        self.num_buffers = num_buffers
        self.stream = torch.cuda.Stream(device)
        self.copy_times = EventTimes()
        self.wait_seconds = 0.0  # the loop blocked for a free buffer, with the device idle
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (states, extremes), pinned
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()

    def _acquire(self) -> int:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if len(self._buffers) < self.num_buffers:  # allocated on first need: a short run pins less
            self._buffers.append((torch.empty(self.capacity, dtype=self.dtype, pin_memory=True),
                                  torch.empty(2, dtype=self.dtype, pin_memory=True)))
            return len(self._buffers) - 1
        # Every buffer is with the writer. Let the device finish the forward already launched, so
        # that the time blocked below is time the device had nothing to do (write_wait), not compute.
        torch.cuda.current_stream(self.device).synchronize()
        t0 = time.perf_counter()
        slot = self._free.get()
        self.wait_seconds += time.perf_counter() - t0
        return slot

    def stage(self, batch: ForwardedBatch) -> StagedBatch:
        hidden = batch.hidden
        if hidden.numel() > self.capacity:
            raise ValueError(f"a batch of {tuple(hidden.shape)} does not fit the {self.capacity}-element buffers")
        slot = self._acquire()
        states, extremes = self._buffers[slot]
        host = states[: hidden.numel()].view(hidden.shape)
        # Over the padding too, as _check_batch does on the host: only a non-finite batch is checked row by row.
        lo_hi = torch.stack(torch.aminmax(hidden))
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # the copy starts once the forward that wrote `hidden` is done
        start, copied = _timed_events()
        with torch.cuda.stream(self.stream):
            start.record()
            host.copy_(hidden, non_blocking=True)
            extremes.copy_(lo_hi, non_blocking=True)
            copied.record()
        # The loop drops its references at once; the allocator must not hand their memory to the next
        # forward before this stream has read it.
        hidden.record_stream(self.stream)
        lo_hi.record_stream(self.stream)
        self.copy_times.add(start, copied)
        return StagedBatch(batch.indices, batch.rows, host, extremes, copied=copied, slot=slot)

    def release(self, staged: StagedBatch) -> None:
        """Give the batch's buffer back (its files are written, or will not be)."""
        self._free.put(staged.slot)

    def copy_seconds(self) -> float:
        return self.copy_times.total()
