"""Writes that workers make while a stage runs: start, progress, lease, failure, metrics; and the pipeline's
rules between stages (what gates training, what follows a stage's success). The typed result of each stage
is recorded by runs.pipeline.lifecycle.result_records, through stage_succeed here."""
from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.data.extractions import extraction_training_gate
from runs.checkpoints.models import Checkpoint
from runs.data.models import Extraction
from runs.pipeline.lifecycle import signals
from runs.pipeline.models import PipelineRun, StageAttempt
from runs.pipeline.lifecycle.stage_record import StageRecord, StageStatus
from runs.tracking.services import metrics_truncate
from runs.pipeline.status.changes import training_changed
from runs.pipeline.online.selectors import run_id_is_online
from runs.pipeline.shards.rows import shards_cancel, stages_with_live_shards
from runs.pipeline.lifecycle.stages import JOBS, STAGES, STAGES_BY_NAME
from workers.contract.failures import Failure, failure_details, failure_from_text

logger = logging.getLogger(__name__)


class StageCancelled(Exception):
    """The stage's row is no longer running (a user cancelled it); the worker must stop."""


# A stage whose worker was lost this many times is failed with the reason instead of queued again.
MAX_ATTEMPTS = 3

# Set by the workers' stage task: a stage that succeeds there hands its run's next stage to the
# queue in the transaction that records the success. Unset, as in `run_pipeline --inline` (which
# runs every stage itself) and in tests that run one stage, a success hands over nothing.
HAND_OVER_NEXT: ContextVar[bool] = ContextVar("hand_over_next", default=False)

def _stage_qs(stage_name: str, record_id: int, started_at: datetime | None = None):
    """The stage's row; with `started_at`, only while it is still the attempt that began then, so a
    worker that lost its lease (and was replaced) can no longer write to the row."""
    qs = STAGES_BY_NAME[stage_name].model.objects.filter(pk=record_id)
    return qs if started_at is None else qs.filter(started_at=started_at)


def _lease_end() -> datetime:
    return timezone.now() + timedelta(seconds=settings.EAGLE3WEB_STAGE_LEASE_SECONDS)


def stage_record_id(*, stage_name: str, run_id: int) -> int:
    """The row that records `stage_name` for a run (the pipeline's tasks carry run ids)."""
    return STAGES_BY_NAME[stage_name].model.objects.values_list("pk", flat=True).get(run_id=run_id)


def stage_waits_for_previous(*, stage_name: str, run_id: int) -> str | None:
    """The earlier stage of the run that has not succeeded (so this one may not start), or None.

    A stage's message is sent when the stage before it succeeds, but a copy can come earlier (one the
    broker gave back after its visibility timeout, or one sent again for a worker taken for dead):
    that copy must leave its stage queued for the hand-over that runs the stages in order."""
    names = [stage.name for stage in STAGES]
    if names.index(stage_name) == 0:
        return None
    previous = names[names.index(stage_name) - 1]
    unfinished = STAGES_BY_NAME[previous].model.objects.filter(run_id=run_id).exclude(status=StageStatus.SUCCEEDED)
    return previous if unfinished.exists() else None


@transaction.atomic
def stage_start(*, stage_name: str, record_id: int, worker: str = "") -> StageRecord | None:
    """Mark a queued stage running. None if it was cancelled or already ran (a redelivered task), is gone
    (its run or job deleted while its message waited), or if the pipeline's rules refuse to start it (then
    it is failed with the reason)."""
    stage = _stage_qs(stage_name, record_id).select_for_update().first()
    if stage is None or stage.status != StageStatus.QUEUED:
        return None
    if stage_name == "train":
        # Nobody trains on hidden states that disagree with their manifest, unless a reviewer said why.
        extraction = Extraction.objects.filter(produced_by__run_id=stage.run_id).first()
        # An online run has none: its training asks capture servers (runs.pipeline.online.selectors).
        blocked = (extraction_training_gate(extraction=extraction) if extraction else
                   None if run_id_is_online(stage.run_id) else
                   f"run {stage.run_id} has no extraction to train on: its extract stage did not succeed")
        if blocked:
            stage_fail(stage_name=stage_name, record_id=record_id, error=blocked, log_tail="")
            return None
        # An earlier attempt's curves and checkpoints stay: the training resumes from its saved state
        # and, once it knows from which step, drops what came after (training_resume).
    stage.status = StageStatus.RUNNING
    stage.started_at = timezone.now()
    stage.worker = worker[:200]
    stage.lease_expires_at = _lease_end()
    stage.save(update_fields=["status", "started_at", "worker", "lease_expires_at"])
    earlier = StageAttempt.objects.filter(stage=stage_name, record_id=record_id).count()
    StageAttempt.objects.create(run_id=getattr(stage, "run_id", None), stage=stage_name, record_id=record_id, number=earlier + 1,
                                worker=stage.worker, started_at=stage.started_at)
    return stage


def _attempt_close(*, stage_name: str, record_id: int, outcome: str, log_tail: str, error: str = "",
                   started_at: datetime | None = None) -> None:
    """End the attempt that began at `started_at` (any running one of the row when not given)."""
    attempts = StageAttempt.objects.filter(stage=stage_name, record_id=record_id, outcome=StageStatus.RUNNING)
    if started_at is not None:
        attempts = attempts.filter(started_at=started_at)
    attempts.update(outcome=outcome, finished_at=timezone.now(), log_tail=log_tail, error=error)


def stage_progress(*, stage_name: str, record_id: int, done: int, total: int, log_tail: str,
                   started_at: datetime | None = None) -> None:
    updated = _stage_qs(stage_name, record_id, started_at).filter(status=StageStatus.RUNNING).update(
        progress_done=done, progress_total=total, log_tail=log_tail, lease_expires_at=_lease_end()
    )
    if not updated:
        raise StageCancelled(f"{stage_name} {record_id} is no longer running")


def training_split_record(*, training_run_id: int, split: dict, started_at: datetime | None = None) -> None:
    """The split a training runs on, as soon as it is made (the result repeats it at the end)."""
    _stage_qs("train", training_run_id, started_at).filter(status=StageStatus.RUNNING).update(split=split)


@transaction.atomic
def training_resume(*, training_run_id: int, step: int, epochs_done: int, started_at: datetime | None = None) -> int:
    """A training (re)starts at `step` with `epochs_done` epochs finished (0 and 0: from scratch).

    Curves and checkpoints an earlier attempt reported up to there are the resumed training's own
    and stay; what it reported later (steps past its last saved state, epochs it will train again)
    goes, so that no step appears twice. Returns the metric points removed."""
    if started_at is not None and not _stage_qs("train", training_run_id, started_at).filter(
            status=StageStatus.RUNNING).exists():
        raise StageCancelled(f"train {training_run_id} is no longer running")
    removed = metrics_truncate(training_run_id=training_run_id, after_step=step)
    if Checkpoint.objects.filter(training_run_id=training_run_id, epoch__gte=epochs_done).delete()[0]:
        training_changed(training_run_id=training_run_id)
    if step:
        logger.info("training %s resumes at step %d (%d epochs done); %d later metric points dropped",
                    training_run_id, step, epochs_done, removed)
    return removed


def stage_heartbeat(*, stage_name: str, record_id: int, started_at: datetime) -> bool:
    """Renew the running stage's lease; False once it is no longer this attempt's to run."""
    return bool(_stage_qs(stage_name, record_id, started_at).filter(status=StageStatus.RUNNING).update(
        lease_expires_at=_lease_end()))


def stages_reconcile() -> list[str]:
    """Running stages whose worker stopped renewing the lease (killed, host gone, cut off): queue
    them again and hand them to the workers, or after MAX_ATTEMPTS fail them saying why. Safe to
    run from every worker at once. Returns what it did, in words."""
    from runs.pipeline.dispatch.queue import evaluation_enqueue, job_enqueue, pipeline_enqueue

    now = timezone.now()
    legacy = now - timedelta(seconds=settings.EAGLE3WEB_STAGE_LEASE_SECONDS)
    lapsed = Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True, started_at__lt=legacy)
    done = []
    for kind in (*STAGES, *JOBS):
        rows = kind.model.objects.filter(lapsed, status=StageStatus.RUNNING)
        if kind.related_name:  # a run trained elsewhere holds no lease: its client, not a worker, runs it
            rows = rows.exclude(run__external=True)
        # A stage split into shards lives while a shard is queued or running: shards_reconcile cares for those.
        rows = rows.exclude(pk__in=stages_with_live_shards(kind.name))
        for pk in rows.values_list("pk", flat=True):
            with transaction.atomic():
                row = kind.model.objects.select_for_update(skip_locked=True).filter(
                    lapsed, pk=pk, status=StageStatus.RUNNING).first()
                if row is None:
                    continue
                attempts = StageAttempt.objects.filter(stage=kind.name, record_id=pk).count()
                lost = (f"worker {row.worker or '?'} stopped renewing its lease "
                        f"(expired {timezone.localtime(row.lease_expires_at or now):%Y-%m-%d %H:%M:%S}): it was "
                        "killed, its host went away, or it lost the database")
                signals.worker_lost.send(sender=PipelineRun, stage_name=kind.name, record_id=pk,
                                         run_id=getattr(row, "run_id", None), worker=row.worker, attempt=attempts)
                if attempts >= MAX_ATTEMPTS:
                    stage_fail(stage_name=kind.name, record_id=pk, log_tail=row.log_tail,
                               error=f"{lost}; gave up after {attempts} attempts")
                    done.append(f"{kind.name} {pk} failed after {attempts} lost attempts")
                    continue
                _attempt_close(stage_name=kind.name, record_id=pk, outcome=StageStatus.FAILED,
                               log_tail=row.log_tail, error=f"{lost}; queued again", started_at=row.started_at)
                kind.model.objects.filter(pk=pk).update(  # queued_at: it joins the back of its queue now
                    status=StageStatus.QUEUED, queued_at=now, started_at=None, finished_at=None, lease_expires_at=None,
                    progress_done=0, progress_total=0, worker="")
                if kind.is_job:
                    job_enqueue(job_name=kind.name, record_id=pk)
                elif row.run_id is not None:
                    # Stages after it were left queued by the lost chain; one new chain runs them all.
                    pipeline_enqueue(run_id=row.run_id)
                else:
                    evaluation_enqueue(evaluation_id=pk)
                done.append(f"{kind.name} {pk} queued again (attempt {attempts + 1} of {MAX_ATTEMPTS})")
    for line in done:
        logger.warning("reconciled: %s", line)
    return done


@transaction.atomic
def stage_succeed(*, stage_name: str, record_id: int, fields: dict, log_tail: str,
                  started_at: datetime | None = None) -> None:
    updated = _stage_qs(stage_name, record_id, started_at).filter(status=StageStatus.RUNNING).update(
        status=StageStatus.SUCCEEDED, finished_at=timezone.now(), log_tail=log_tail, lease_expires_at=None, **fields
    )
    if not updated:
        raise StageCancelled(f"{stage_name} {record_id} was cancelled before it could finish")
    _attempt_close(stage_name=stage_name, record_id=record_id, outcome=StageStatus.SUCCEEDED, log_tail=log_tail,
                   started_at=started_at)
    if STAGES_BY_NAME[stage_name].is_job:
        return
    run_id = _stage_qs(stage_name, record_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return  # a checkpoint's measurement outside a run
    if stage_name == STAGES[-1].name:
        signals.run_over.send(sender=PipelineRun, run_id=run_id)  # the run is done: its sweep's next run goes

    elif HAND_OVER_NEXT.get():
        from runs.pipeline.dispatch.queue import pipeline_enqueue

        pipeline_enqueue(run_id=run_id)  # the outbox row commits with the success, or neither does

@transaction.atomic
def stage_fail(*, stage_name: str, record_id: int, error: str, log_tail: str, cancelled: bool = False,
               started_at: datetime | None = None, failure: Failure | None = None, trace: str = "") -> None:
    """Record the failure and, for a pipeline stage, cancel the stages after it, saying why.

    `error` is the sentence the pages show; `failure` says whether a retry can help and which field to
    change (workers.contract.failures), read from `error` when a caller has only text (a lost lease, a
    refusal); `trace` is the details for developers."""
    now = timezone.now()
    status = StageStatus.CANCELLED if cancelled else StageStatus.FAILED
    if failure is None and not cancelled:
        failure = failure_from_text(error, stage_name=stage_name)
        if failure.specific:  # a lost lease: worded by the table; a caller's own sentence stays as it is
            error, trace = failure.sentence, trace or failure_details(error, "")
    updated = _stage_qs(stage_name, record_id, started_at).filter(
        status__in=[StageStatus.RUNNING, StageStatus.QUEUED]).update(
        status=status, finished_at=now, error=error[-20000:], log_tail=log_tail, lease_expires_at=None,
        error_trace=trace[-20000:], failure_kind=failure.kind if failure else "",
        failure_field=failure.field if failure else "",
    )
    _attempt_close(stage_name=stage_name, record_id=record_id, outcome=status, log_tail=log_tail, error=error[-20000:],
                   started_at=started_at)
    if updated and cancelled:  # a failure leaves its other shards to finish, so that Retry has less to do
        shards_cancel(stage_name=stage_name, record_id=record_id)
    if started_at is not None and not updated and not _stage_qs(stage_name, record_id, started_at).exists():
        return  # the row went on without this attempt (queued again, retried): later stages are not its to cancel
    if STAGES_BY_NAME[stage_name].is_job:
        return  # a job stands alone
    run_id = _stage_qs(stage_name, record_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return
    names = [stage.name for stage in STAGES]
    for later in names[names.index(stage_name) + 1 :]:
        STAGES_BY_NAME[later].model.objects.filter(run_id=run_id, status=StageStatus.QUEUED).update(
            status=StageStatus.CANCELLED, finished_at=now, error=f"not started: {stage_name} did not succeed"
        )
    if updated and not cancelled:
        signals.run_failed.send(sender=PipelineRun, run_id=run_id, stage_name=stage_name, error=error)
    signals.run_over.send(sender=PipelineRun, run_id=run_id)  # the run is over: its sweep's next run goes
