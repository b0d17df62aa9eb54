"""Writes about a training across nodes (a run's train_nodes > 1): who holds which rank of an attempt.

The worker that starts the training's attempt holds rank 0: it opens one TrainingNode row per rank, with
its rendezvous endpoint on rank 0's, and hands one message per other rank to the training's queue
(eagle3web.train_rank) through the outbox, as every hand-over (runs.pipeline.dispatch.queue.rank_enqueue: a broker
away when it commits keeps them, and the workers' reconcilers send them once it answers). A worker that takes one joins
the gang, unless it already holds a rank of the attempt (it gives the message back) or the attempt is over. The gang is
complete when every rank is joined; its ranks then start torchrun (workers.stages.train.processes.nodes). Every rank's worker
renews its row's lease and watches the others' (gang_broken): a failed rank, a lapsed lease or a replaced attempt ends
the attempt for every rank, and the stage's retry starts a new attempt with new rows.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.pipeline.models import StageAttempt, TrainingRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.nodes.models import TrainingNode
from runs.pipeline.dispatch.queue import rank_enqueue
from runs.pipeline.dispatch.routing import stage_queue

Status = TrainingNode.Status


def _lease_end():
    return timezone.now() + timedelta(seconds=settings.EAGLE3WEB_STAGE_LEASE_SECONDS)


def node_queue(*, training_id: int) -> str:
    training = TrainingRun.objects.select_related("run").get(pk=training_id)
    return stage_queue(stage_name="train", config=training.run.config or {})


@transaction.atomic
def nodes_open(*, training_id: int, stage_started_at, nodes: int, worker: str, host: str, endpoint: str) -> int:
    """The rows of a new attempt's ranks, rank 0 held by `worker` (its id returned); the other ranks'
    messages go to the training's queue once this commits."""
    attempt = StageAttempt.objects.filter(stage="train", record_id=training_id).count()
    now = timezone.now()
    rows = [TrainingNode(training_id=training_id, attempt=attempt, stage_started_at=stage_started_at, rank=rank)
            for rank in range(nodes)]
    rows[0].worker, rows[0].host, rows[0].endpoint = worker[:200], host[:255], endpoint[:300]
    rows[0].status, rows[0].started_at, rows[0].lease_expires_at = Status.JOINED, now, _lease_end()
    created = TrainingNode.objects.bulk_create(rows)
    for row in created[1:]:
        rank_enqueue(node_id=row.pk)
    return created[0].pk


def _attempt_current(node: TrainingNode) -> bool:
    return TrainingRun.objects.filter(pk=node.training_id, status=StageStatus.RUNNING,
                                      started_at=node.stage_started_at).exists()


@transaction.atomic
def node_join(*, node_id: int, worker: str, host: str) -> str:
    """"joined" (this worker now holds the rank), "held" (it already holds a rank of this attempt: the
    message goes back to the queue for another worker) or "over" (the rank is taken or the attempt ended)."""
    node = TrainingNode.objects.select_for_update().filter(pk=node_id).first()
    if node is None or node.status != Status.WAITING or not _attempt_current(node):
        return "over"
    if TrainingNode.objects.filter(training_id=node.training_id, attempt=node.attempt, worker=worker).exists():
        rank_enqueue(node_id=node_id)
        return "held"
    node.worker, node.host, node.status = worker[:200], host[:255], Status.JOINED
    node.started_at, node.lease_expires_at = timezone.now(), _lease_end()
    node.save(update_fields=["worker", "host", "status", "started_at", "lease_expires_at"])
    return "joined"


def gang_missing(*, node_id: int) -> list[int]:
    """The ranks of this node's attempt that no worker holds yet."""
    node = TrainingNode.objects.get(pk=node_id)
    return list(TrainingNode.objects.filter(training_id=node.training_id, attempt=node.attempt,
                                            status=Status.WAITING).values_list("rank", flat=True))


def gang_place(*, node_id: int) -> dict:
    """What this node's torchrun needs: the gang's size, its rank, rank 0's endpoint, the attempt's id."""
    node = TrainingNode.objects.get(pk=node_id)
    gang = TrainingNode.objects.filter(training_id=node.training_id, attempt=node.attempt)
    return {"nodes": gang.count(), "rank": node.rank, "endpoint": gang.get(rank=0).endpoint,
            "rdzv_id": f"eagle3web-training-{node.training_id}-attempt-{node.attempt}"}


def gang_broken(*, node_id: int) -> str | None:
    """Why this node's attempt cannot go on (in words), or None while it can."""
    node = TrainingNode.objects.get(pk=node_id)
    if node.status in (Status.FAILED, Status.SUCCEEDED) and node.rank != 0:
        return f"rank {node.rank} was marked {node.status}"
    if not _attempt_current(node):
        return "the training's attempt ended (cancelled, failed on another rank, or handed to a new attempt)"
    for other in TrainingNode.objects.filter(training_id=node.training_id, attempt=node.attempt).exclude(pk=node_id):
        if other.status == Status.FAILED:
            return f"rank {other.rank} on {other.worker or 'no worker'} failed: {other.error.splitlines()[0] if other.error else ''}"
        if other.status in (Status.JOINED, Status.RUNNING) and other.lease_expires_at < timezone.now():
            return f"rank {other.rank}'s worker {other.worker} stopped renewing its lease (lost, or its host is down)"
    return None


def node_heartbeat(*, node_id: int) -> None:
    TrainingNode.objects.filter(pk=node_id, status__in=[Status.JOINED, Status.RUNNING]).update(lease_expires_at=_lease_end())


def node_mark(*, node_id: int, status: str, log_tail: str = "", error: str = "") -> None:
    fields = {"status": status, "lease_expires_at": _lease_end()}
    if status in (Status.SUCCEEDED, Status.FAILED):
        fields.update(finished_at=timezone.now(), log_tail=log_tail, error=error)
    TrainingNode.objects.filter(pk=node_id).update(**fields)


def gang_give_up(*, node_id: int, missing: list[int], seconds: int) -> str:
    """The attempt's waiting ranks marked failed; the error the stage fails with, naming them."""
    node = TrainingNode.objects.get(pk=node_id)
    error = (f"the training's gang of {TrainingNode.objects.filter(training_id=node.training_id, attempt=node.attempt).count()} "
             f"nodes was not complete within {seconds} s (EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS): "
             f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
             f"{'were' if len(missing) > 1 else 'was'} taken by no worker. Start more workers taking "
             f"{node_queue(training_id=node.training_id)} (one per rank), or retry with fewer train_nodes")
    TrainingNode.objects.filter(training_id=node.training_id, attempt=node.attempt, status=Status.WAITING).update(
        status=Status.FAILED, finished_at=timezone.now(), error="no worker took this rank in time")
    return error
