"""Our loop across nodes: each step's rows split over torchrun's ranks, gradients averaged by
DistributedDataParallel, so that a step trains on the same global batch as one process would.

speculators' loss for a TTT step is a token mean over the step's packed batch (masked sum divided by
the mask's count plus a small epsilon, speculators.losses.utils.loss_function). A rank's batch holds
only its share of the rows, so its mean has its own count; DDP then averages the ranks' gradients.
To make that average the gradient of the one-process mean, each rank weighs its TTT step k by
world * (its count + eps) / (the global count + eps): the counts are all-reduced first (a tiny
all-reduce per step), and DDP's division by world cancels the factor. The metrics are all-reduced the
same way, so every rank holds the one-process step's loss and accuracies; the node that writes
(workers.stages.train.processes.nodes: rank 0 of the training, local rank 0) reports them, once.

A step with fewer rows with tokens than ranks gives the ranks left over a row of the step with weight
0: DDP needs every rank in every backward, and a zero weight keeps the row out of the gradient.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

LOSS_EPS = 1e-5  # speculators.losses.utils._LOSS_REDUCTION_EPS: the same denominator as one process


@dataclass(frozen=True)
class Ranks:
    rank: int  # torch's global rank (the rendezvous orders the nodes)
    world: int
    writer: bool  # this process writes checkpoints, resume states and reports metrics

    @classmethod
    def from_env(cls) -> "Ranks":
        """Under torchrun: RANK and WORLD_SIZE from torch's launcher; the writer is local rank 0 of the
        node our database calls rank 0 (EAGLE3WEB_TRAIN_NODE_RANK), whatever global rank c10d gave it."""
        node = int(os.environ.get("EAGLE3WEB_TRAIN_NODE_RANK", "0"))
        return cls(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]),
                   writer=node == 0 and int(os.environ.get("LOCAL_RANK", "0")) == 0)


def rank_plan(plan: list[list[int]], lengths: list[int], ranks: Ranks) -> tuple[list[list[int]], list[bool]]:
    """This rank's rows of each step (every world-th row with tokens, from its rank on), and whether they
    count (False: a stand-in row weighted 0). Steps without a token to predict are dropped, as
    iter_batches drops them, so every rank trains the same steps."""
    shares, real = [], []
    for rows in plan:
        trainable = [i for i in rows if lengths[i] >= 2]
        if not trainable:
            continue
        mine = trainable[ranks.rank::ranks.world]
        shares.append(mine or trainable[:1])
        real.append(bool(mine))
    return shares, real


def step_weights(loss_mask: torch.Tensor, *, ttt_steps: int, real: bool, world: int) -> list[float]:
    """Each TTT step's loss weight on this rank (see the module's note); all-reduces the counts."""
    mask = loss_mask.reshape(1, -1).to(torch.float64)
    local = torch.stack([mask[:, k:].sum() for k in range(ttt_steps)]) if real else torch.zeros(ttt_steps, dtype=torch.float64)
    total = local.clone()
    dist.all_reduce(total)
    return [float(world * (local[k] + LOSS_EPS) / (total[k] + LOSS_EPS)) if real else 0.0 for k in range(ttt_steps)]


def reduce_metrics(raw: dict[str, float], *, weights: list[float], world: int, real: bool) -> dict[str, float]:
    """The one-process step's metrics from each rank's: losses as weighted shares of the global mean,
    accuracy counts summed; a stand-in row adds nothing."""
    keys = sorted(raw)
    shares = []
    for key in keys:
        value = raw[key]
        if not real:
            share = 0.0
        elif key == "loss_sum":  # the weighted sum itself: world times this rank's share
            share = value / world
        elif key.startswith("loss_") and key.endswith("_sum"):
            share = value * weights[int(key[len("loss_"):-len("_sum")])] / world
        elif key.startswith("loss") and key.endswith("_total"):
            share = value / world  # 1 on every rank: stays 1
        else:
            share = value
        shares.append(share)
    summed = torch.tensor(shares, dtype=torch.float64)
    dist.all_reduce(summed)
    return dict(zip(keys, summed.tolist(), strict=True))


def all_sum(value: float) -> float:
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total[0])
