"""What a training hands back and reports, whichever trainer ran it (workers.stages.train.loop, or
speculators' Trainer in workers.stages.train.with_speculators): its result, its checkpoints, the stop
it was asked for, the metric keys it reports and the rule that marks the best epoch."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402
import re  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from speculators.train.utils import normalize_counted_metrics  # noqa: E402

from workers.contract.errors import StopRequested  # noqa: E402
from workers.stages.train.online.source import SupplyReport  # noqa: E402
from workers.stages.train.holdout.split import SplitInfo  # noqa: E402

# The keys a training step reports (the client's handler names speculators' points the same way).
METRIC_KEY = re.compile(r"^(loss|loss_\d+|full_acc_\d+|cond_acc_\d+)$")


class TrainingStopped(StopRequested):
    """should_stop() asked the loop to end; nothing after the last finished epoch was saved."""

    def __init__(self, steps_done: int):
        super().__init__(f"training stopped on request after {steps_done} steps")
        self.steps_done = steps_done

    def __reduce__(self):  # rebuilt from steps_done in the worker (workers.stages.train.processes.in_child)
        return type(self), (self.steps_done,)


@dataclass(frozen=True)
class CheckpointInfo:
    epoch: int
    path: Path
    train_loss: float
    val_loss: float
    val_metrics: dict
    is_best: bool


def lowest_val_loss_epoch(losses: dict[int, float]) -> int:
    """The epoch with the lowest validation loss, the earlier on a tie; a NaN loss (a diverged validation)
    never wins, where min() would keep it (NaN compares false). The trainers mark it best; the run's best
    is decided later, by the τ measured for every checkpoint unless the run chose validation loss
    (runs.pipeline.best applies the same rule to the registered losses)."""
    return min(losses, key=lambda e: (math.inf if math.isnan(losses[e]) else losses[e], e))


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    checkpoints: list[CheckpointInfo]
    best_epoch: int
    steps: int
    train_tokens: int
    tokens_per_second: float
    seconds: float
    tokens_per_step: int  # the packing budget used: max(requested or 512, longest prepared row)
    # Supervised tokens that can reach the loss: loss_mask[1:] summed over the train split's rows
    # (shift_batch drops position 0, which nothing predicts; prepared rows never mask it). Rows of
    # fewer than 2 tokens are counted here too, though they add nothing, and in rows_unusable.
    loss_tokens_available: int
    loss_tokens_trained: int  # loss_mask summed over the shifted batches of the last epoch
    loss_tokens_per_epoch: list[int]
    rows_unusable: int  # train-split rows under 2 tokens: shift_batch leaves nothing to train on
    split: SplitInfo
    device: str  # e.g. "cpu" or "cuda:0 (NVIDIA H200)"
    # How steps ran (workers.stages.train.step.stepper): e.g. "attention flex, loss fused, compute bfloat16";
    # seconds per phase of this attempt's training steps (data wait, copies, forward, backward,
    # optimizer); the padded step lengths seen (training and validation) and the graphs torch.compile
    # built for them, and of those the ones beyond one per length, grad mode and TTT step.
    step_config: str = ""
    time_split_s: dict = field(default_factory=dict)
    step_lengths: list = field(default_factory=list)
    graphs_compiled: int = 0
    recompiles: int = 0
    # A retried training continues from the resume state an earlier attempt saved (0: from the start).
    # steps, train_tokens and the loss figures cover the whole training, earlier attempts included;
    # tokens_per_second and seconds are this attempt's (the earlier attempts' when this one had no step left).
    resumed_from_step: int = 0
    stopped_early: str = ""  # why training ended before its last epoch (stop_early's words); "" when it did not
    # Where the hidden states came from and how well they kept up (workers.stages.train.online.SupplyReport).
    supply: dict = field(default_factory=dict)




def public_metrics(raw: dict) -> dict[str, float]:
    """A step's counted metrics as ratios (speculators' normalize_counted_metrics), the reported keys only."""
    values = normalize_counted_metrics({k: float(v) for k, v in raw.items()})
    return {k: v for k, v in values.items() if METRIC_KEY.match(k)}




def offline_supply(time_split_s: dict, seconds: float) -> dict:
    """An extraction on disk: the share of step time the trainer waited for its next batch."""
    wait = float(time_split_s.get("data", 0.0))
    return SupplyReport(hidden_states="offline", fetch_wait_seconds=wait,
                        fetch_wait_fraction=min(1.0, wait / seconds) if seconds > 0 else 0.0).as_dict()
