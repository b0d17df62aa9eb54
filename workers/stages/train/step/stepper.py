"""How the training loop runs one step on its device, and where the step's time goes.

`DraftStepper` holds what the device decides: the attention (flex block mask, compiled, on CUDA;
the per-document twin on the CPU, where flex has no backward), the KL loss (speculators' fused
Triton kernel where it runs, else chunked), the compute dtype (bf16 autocast on CUDA, fp32 on the
CPU) and the padded step lengths (a handful on CUDA, so the compiled kernel sees a handful of
shapes; exact on the CPU, where nothing is compiled). `prefetch` reads and collates the next steps
on a thread (bounded queue) into pinned memory, so the GPU does not wait on files between steps.
"""
from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Iterator

import torch

from workers.stages.torch_internals import compiled_graph_count
from workers.stages.train.step.packed_step import (DraftForward, draft_forward, kl_loss_config, padded_length,
                                                   use_packed_attention)

PHASES = ("data", "copies", "forward", "backward", "optimizer")


def compiled_graphs() -> int:
    """Graphs dynamo compiled in this process so far (a recompile adds one too)."""
    return compiled_graph_count()


class StepTimes:
    """Seconds per phase, summed over steps. On CUDA the GPU phases are timed by events read at the
    step's end (the metrics read there synchronize anyway); `data` is host time spent waiting for
    the next batch."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._marks: list = []

    def start(self) -> None:
        self._marks = [self._mark()]

    def mark(self) -> None:
        self._marks.append(self._mark())

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def finish(self) -> None:
        """Add the step's marked phases (copies, forward, backward, optimizer) to the sums."""
        marks, self._marks = self._marks, []
        for phase, (a, b) in zip(PHASES[1:], zip(marks, marks[1:])):
            self.seconds[phase] += a.elapsed_time(b) / 1000.0 if self.cuda else b - a

    def add_data(self, seconds: float) -> None:
        self.seconds["data"] += seconds

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}


class DraftStepper:
    def __init__(self, model, *, device: torch.device, ttt_steps: int, attention: str = "auto",
                 loss: str = "auto"):
        if attention == "auto":
            attention = "flex" if device.type == "cuda" else "document"
        if attention not in ("flex", "document"):
            raise ValueError(f"attention must be auto, flex or document, got {attention!r}")
        self.model, self.device, self.ttt_steps, self.attention = model, device, ttt_steps, attention
        use_packed_attention(model)
        self.loss_config, self.loss_implementation = kl_loss_config(device, loss)
        self.compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.times = StepTimes(device)
        self._graphs_at_start = compiled_graphs()
        self.shapes: set[tuple[int, bool]] = set()  # (step length, grad enabled) of every forward
        self.ddp = None  # DistributedDataParallel over the model, on one rank of several

    def distribute(self) -> None:
        """Train under DistributedDataParallel (the process group is up: workers.stages.train.processes.ddp); it
        broadcasts rank 0's weights first. Validation and checkpoints keep using the plain model."""
        from torch.nn.parallel import DistributedDataParallel

        self.ddp = DistributedDataParallel(DraftForward(self.model),
                                           device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def describe(self) -> str:
        return (f"attention {self.attention}, loss {self.loss_implementation}, "
                f"compute {str(self.compute_dtype).removeprefix('torch.')}")

    def step_length(self, tokens: int, budget: int) -> int:
        """Padded to one of a few lengths for the compiled flex kernel; exact for the twin."""
        return padded_length(tokens, budget) if self.attention == "flex" else tokens

    def graphs_compiled(self) -> int:
        return compiled_graphs() - self._graphs_at_start

    def recompiles(self) -> int:
        """Graphs compiled beyond the one per (step length, grad mode, TTT step) that flex needs: the
        keys grow by a block each TTT step, and training and validation trace apart."""
        expected = len(self.shapes) * self.ttt_steps if self.attention == "flex" else 0
        return max(0, self.graphs_compiled() - expected)

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward(self, batch: dict, *, timed: bool, step_weights: list[float] | None = None):
        self.shapes.add((int(batch["input_ids"].shape[1]), torch.is_grad_enabled()))
        batch = {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                 for k, v in batch.items()}
        if timed:  # validation records no phases: a mark per batch would pile up CUDA events
            self.times.mark()
        forward = (functools.partial(self.ddp, step_weights=step_weights) if self.ddp is not None and timed
                   else functools.partial(draft_forward, self.model))
        with self._autocast():
            return forward(hidden_states=batch["hidden_states"], input_ids=batch["input_ids"],
                           document_ids=batch["document_ids"], loss_mask=batch["loss_mask"],
                           position_ids=batch["position_ids"],
                           verifier_last_hidden_states=batch["verifier_last_hidden_states"],
                           ttt_steps=self.ttt_steps, loss_config=self.loss_config, attention=self.attention,
                           compute_dtype=self.compute_dtype)

    def train_step(self, batch: dict, optimizer, scheduler, step_weights: list[float] | None = None
                   ) -> tuple[torch.Tensor, dict]:
        """Trainer.train_epoch's step: forward (autocast on CUDA), backward, clip at 1.0, step, schedule."""
        self.times.start()
        _tokens, loss, metrics = self._forward(batch, timed=True, step_weights=step_weights)
        self.times.mark()
        optimizer.zero_grad()
        loss.backward()
        self.times.mark()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        self.times.mark()
        values = {k: float(v) for k, v in metrics.items()}  # synchronizes: the events are complete
        self.times.finish()
        return loss.detach(), values

    @torch.no_grad()
    def eval_step(self, batch: dict) -> dict[str, float]:
        """Validation: the forward alone, not timed."""
        _tokens, _loss, metrics = self._forward(batch, timed=False)
        return {k: float(v) for k, v in metrics.items()}

    def timed(self, batches: Iterator[dict]) -> Iterator[dict]:
        """`batches`, the host's wait for each added to the data phase."""
        iterator = iter(batches)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.times.add_data(time.perf_counter() - started)
            yield batch


_DONE = object()


def prefetch(batches: Iterator[dict], *, device: torch.device, depth: int = 2) -> Iterator[dict]:
    """On CUDA: yield `batches` as a thread reads and collates them ahead, at most `depth` waiting
    (back-pressure, bounded memory), each batch's tensors in pinned memory so that its copy to the GPU
    is asynchronous; an error in the thread is raised here, at the batch it happened on. On the CPU:
    `batches` as they are, since the step already keeps every core busy (bench/pipeline/pipeline.py on 2 cores:
    with a reading thread beside it the stage ran at 0.54x of the bare loop, without it 0.84x)."""
    if device.type != "cuda":
        return iter(batches)
    return read_ahead(batches, depth=depth, pin=True)


def read_ahead(batches: Iterator[dict], *, depth: int, pin: bool) -> Iterator[dict]:
    """`batches` produced on a thread, at most `depth` waiting; see prefetch."""
    waiting: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                if pin:
                    batch = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                while not stop.is_set():
                    try:
                        waiting.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            waiting.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            waiting.put(exc)

    thread = threading.Thread(target=produce, name="train-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = waiting.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue, then let it end
            with contextlib.suppress(queue.Empty):
                waiting.get(timeout=0.1)
        thread.join()
