"""Handing work to the workers, by task name: the web tier never imports the tasks (nor, through
them, torch), and nothing here imports back into the code that enqueues.

Every hand-over goes through an outbox row written in the caller's transaction: after commit the
message is sent and the row deleted; if the broker is down the row stays, with the error, and every
worker's reconciler sends it again until the broker answers. A launch never fails on the broker.

A run's stages are handed over one at a time: the launch sends the first, and each stage that
succeeds writes the next one's outbox row in the transaction that records its success
(stage_services.stage_succeed), so a stage that finishes while the broker is away hands over once it
is back. (A Celery chain sent the next stage from the finishing task, after the database had
committed: a broker away at that moment lost the hand-over, and a broker restarted empty lost every
stage after the running one.)
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import DatabaseError, transaction
from django.utils import timezone

from eagle3web.celery import celery_app
from eagle3web.db import db_retry
from runs.pipeline.models import PendingEnqueue, PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.lifecycle.stages import JOB_NAMES, STAGES, STAGES_BY_NAME
from runs.pipeline.dispatch.routing import stage_queue

logger = logging.getLogger(__name__)

STAGE_TASK = "eagle3web.stage"  # workers.orchestration.tasks.stage_task
EVALUATION_TASK = "eagle3web.evaluate_checkpoint"  # workers.orchestration.tasks.evaluation_task
JOB_TASK = "eagle3web.job"  # workers.orchestration.tasks.job_task
SHARD_TASK = "eagle3web.stage_shard"  # workers.orchestration.shard_tasks.stage_shard_task
TRAIN_RANK_TASK = "eagle3web.train_rank"  # workers.orchestration.tasks.train_rank_task
# Rows younger than this are left to their own on-commit delivery.
RETRY_AFTER = timedelta(seconds=5)
# How long a delivery after commit rides out a locked or lost database, in the request that
# committed: past it the row waits for the reconcilers, like a refused hand-over.
DELIVER_DB_SECONDS = 5.0


def _send(kind: str, object_id: int) -> None:
    if kind == PendingEnqueue.Kind.PIPELINE:
        # The run's next stage goes to its queue: cpu, gpu, or its backend's (runs.pipeline.dispatch.routing).
        stage_name = run_next_stage(run_id=object_id)
        if stage_name is not None:
            config = PipelineRun.objects.filter(pk=object_id).values_list("config", flat=True).first() or {}
            celery_app.send_task(STAGE_TASK, args=[stage_name, object_id],
                                 queue=stage_queue(stage_name=stage_name, config=config))
    elif kind == PendingEnqueue.Kind.SHARD:
        from runs.pipeline.shards.models import StageShard

        shard = StageShard.objects.filter(pk=object_id).first()
        if shard is not None and shard.status == StageStatus.QUEUED:
            celery_app.send_task(SHARD_TASK, args=[shard.stage, shard.record_id, shard.index],
                                 queue=stage_row_queue(stage_name=shard.stage, record_id=shard.record_id))
    elif kind == PendingEnqueue.Kind.TRAIN_RANK:
        from runs.pipeline.nodes.models import TrainingNode

        node = TrainingNode.objects.select_related("training__run").filter(pk=object_id).first()
        if node is not None and node.status == TrainingNode.Status.WAITING:
            celery_app.send_task(TRAIN_RANK_TASK, args=[object_id],
                                 queue=stage_queue(stage_name="train", config=node.training.run.config or {}))
    elif kind in JOB_NAMES:
        celery_app.send_task(JOB_TASK, args=[kind, object_id], queue=job_queue(job_name=kind, record_id=object_id))
    else:
        celery_app.send_task(EVALUATION_TASK, args=[object_id], queue=STAGES_BY_NAME["evaluate"].queue)


def run_next_stage(*, run_id: int) -> str | None:
    """The run's stage a worker should take now: its first stage that has not succeeded, when that
    one is queued; None when it runs, ended the run (failed, cancelled) or every stage succeeded."""
    for stage in STAGES:
        status = stage.model.objects.filter(run_id=run_id).values_list("status", flat=True).first()
        if status != StageStatus.SUCCEEDED:
            return stage.name if status == StageStatus.QUEUED else None
    return None


def stage_row_queue(*, stage_name: str, record_id: int) -> str:
    """The queue a stage row (of a run, or a job) is routed to; its shards go there too (issue 36)."""
    if stage_name in JOB_NAMES:
        return job_queue(job_name=stage_name, record_id=record_id)
    run_id = STAGES_BY_NAME[stage_name].model.objects.filter(pk=record_id).values_list("run_id", flat=True).first()
    if run_id is None:  # a checkpoint's own measurement
        return STAGES_BY_NAME[stage_name].queue
    config = PipelineRun.objects.filter(pk=run_id).values_list("config", flat=True).first() or {}
    return stage_queue(stage_name=stage_name, config=config)


def job_queue(*, job_name: str, record_id: int) -> str:
    """A job's queue: its kind's, or for a serve check of a target spread over n GPUs, vLLM's on n, or for a
    regeneration its backend's."""
    if job_name == "serve_check":
        from runs.pipeline.jobs.models import ServeCheck
        from workers.contract.host.backends import stage_queue as backend_queue

        gpus = ServeCheck.objects.filter(pk=record_id).values_list("tensor_parallel_size", flat=True).first() or 1
        return backend_queue(backend="vllm", gpus=gpus)
    if job_name == "regenerate":
        from runs.pipeline.jobs.models import DatasetRegeneration
        from workers.contract.host.backends import stage_queue as backend_queue

        row = DatasetRegeneration.objects.filter(pk=record_id).values_list("backend", "tensor_parallel_size").first()
        return backend_queue(backend=row[0], gpus=row[1]) if row else STAGES_BY_NAME[job_name].queue
    return STAGES_BY_NAME[job_name].queue


def _deliver(pending_id: int) -> bool:
    """Send one outbox row's message; True once sent (and the row gone). Never raises for the broker,
    nor for the database: it runs after its caller committed, so an error here must not turn a
    recorded request into a failed one. A database that stays locked or away past
    DELIVER_DB_SECONDS leaves the row to the workers' reconcilers (outbox_flush)."""
    try:
        return db_retry("hand-over", _deliver_once, within=DELIVER_DB_SECONDS, pending_id=pending_id)
    except DatabaseError:  # the row is committed: a reconciler sends it later
        logger.warning("could not hand outbox row %s over now; a worker's reconciler will", pending_id, exc_info=True)
        return False


def _deliver_once(*, pending_id: int) -> bool:
    with transaction.atomic():
        row = PendingEnqueue.objects.select_for_update(skip_locked=True).filter(pk=pending_id).first()
        if row is None:
            return False
        try:
            _send(row.kind, row.object_id)
        except Exception as exc:  # noqa: BLE001 - any broker failure: keep the row, say why, retry later
            logger.warning("could not hand %s %s to the broker (%s); will retry", row.kind, row.object_id, exc)
            PendingEnqueue.objects.filter(pk=row.pk).update(attempts=row.attempts + 1, last_error=str(exc)[:2000])
            return False
        row.delete()
        return True


def _enqueue_after_commit(kind: str, object_id: int) -> None:
    row = PendingEnqueue.objects.create(kind=kind, object_id=object_id)
    # robust: whatever a hand-over raises is logged, never raised into the committed request.
    transaction.on_commit(lambda: _deliver(row.pk), robust=True)


def pipeline_enqueue(*, run_id: int) -> None:
    """After the caller's transaction commits, hand the run's next queued stage to the workers."""
    _enqueue_after_commit(PendingEnqueue.Kind.PIPELINE, run_id)


def evaluation_enqueue(*, evaluation_id: int) -> None:
    _enqueue_after_commit(PendingEnqueue.Kind.EVALUATION, evaluation_id)


def job_enqueue(*, job_name: str, record_id: int) -> None:
    """After the caller's transaction commits, hand a job's row (runs.pipeline.lifecycle.stages.JOBS) to a worker."""
    _enqueue_after_commit(job_name, record_id)


def shard_enqueue(*, shard_id: int) -> None:
    """After the caller's transaction commits, hand one shard of a stage (runs.pipeline.shards.models) to a worker."""
    _enqueue_after_commit(PendingEnqueue.Kind.SHARD, shard_id)


def rank_enqueue(*, node_id: int) -> None:
    """After the caller's transaction commits, hand a waiting rank of a multi-node training
    (runs.pipeline.nodes.models) to the training's queue: a broker away then keeps it in the outbox."""
    _enqueue_after_commit(PendingEnqueue.Kind.TRAIN_RANK, node_id)


def outbox_flush() -> int:
    """Send what a broker outage left in the outbox; how many were sent."""
    stale = PendingEnqueue.objects.filter(created_at__lt=timezone.now() - RETRY_AFTER).values_list("pk", flat=True)
    return sum(_deliver(pk) for pk in list(stale))


def pending_enqueue(*, kind: str, object_id: int) -> PendingEnqueue | None:
    return PendingEnqueue.objects.filter(kind=kind, object_id=object_id).first()


def run_waiting_for_queue(*, run_id: int) -> PendingEnqueue | None:
    """The run's hand-over the broker refused (kept for the workers to retry), or None."""
    return PendingEnqueue.objects.filter(kind=PendingEnqueue.Kind.PIPELINE, object_id=run_id, attempts__gt=0).first()
