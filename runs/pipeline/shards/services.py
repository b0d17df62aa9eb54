"""Writes for a stage split into shards (issue 36): planning them, a worker starting, renewing and ending
one, the last one's hand-over to the merge, and the reconcilers' care of shards whose worker was lost.

How a sharded stage runs (workers.orchestration.shard_tasks does the running):
- The worker that starts the stage (workers.orchestration.tasks.stage_execute) counts its rows, writes one StageShard
  per span and hands each to the stage's own queue (the outbox, as every hand-over), and returns: no
  pool slot waits for the shards. The stage row stays running; the shards' heartbeats renew its lease,
  and stages_reconcile leaves a stage with live shards to shards_reconcile.
- Any live worker of that queue takes a shard's message, names itself on the shard (message_claims),
  starts it (shard_start: queued -> running, one more attempt), reports progress and renews its lease.
- The shard that succeeds last, which `shard_succeed` decides under a lock on the stage row so that
  exactly one does, merges the shards' outputs and records the stage's result through its recorder.
- A shard that fails fails the stage, naming the shard, its rows and its worker; the other shards go on
  to the end of their rows, so that Retry, which starts the stage again, has only the shards that did
  not succeed to send (shards_resume); their outputs are kept. Cancel stops every shard.
- A running shard whose lease lapsed, or a queued one claimed by a dead worker, is sent again (attempts
  counted, MAX_ATTEMPTS at most), and both the shard's log and the stage's log say so.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from runs.pipeline.status.changes import runs_changed
from runs.pipeline.shards.models import StageShard
from runs.pipeline.shards.rows import shards_of
from runs.pipeline.lifecycle.stage_services import StageCancelled, stage_fail
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.lifecycle.stages import STAGES_BY_NAME

logger = logging.getLogger(__name__)

LOG_CHARS = 20000


def _now_line(line: str) -> str:
    return f"{timezone.localtime():%H:%M:%S} {line}"


def log_appended(log: str, line: str) -> str:
    return (f"{log}\n" if log else "") + _now_line(line)


def _lease_end() -> datetime:
    return timezone.now() + timedelta(seconds=settings.EAGLE3WEB_STAGE_LEASE_SECONDS)


def _stage_rows(stage_name: str, record_id: int):
    return STAGES_BY_NAME[stage_name].model.objects.filter(pk=record_id)


def _run_id(stage_name: str, record_id: int) -> int | None:
    if not any(f.name == "run" for f in STAGES_BY_NAME[stage_name].model._meta.concrete_fields):
        return None
    return _stage_rows(stage_name, record_id).values_list("run_id", flat=True).first()


def stage_note(*, stage_name: str, record_id: int, line: str) -> None:
    """Add a line to the stage's own log: what happened to its shards is read on the stage's panel."""
    with transaction.atomic():
        row = _stage_rows(stage_name, record_id).select_for_update().first()
        if row is not None:
            _stage_rows(stage_name, record_id).update(log_tail=log_appended(row.log_tail, line)[-LOG_CHARS:])


@transaction.atomic
def shards_plan(*, stage_name: str, record_id: int, spans: list[range], batch_tokens: int | None = None) -> list[StageShard]:
    """One shard per span, each handed to the stage's queue once this commits. `batch_tokens`: the budget the
    spans were cut with, which every shard then runs in, whatever its host's own default."""
    from runs.pipeline.dispatch.queue import shard_enqueue

    run_id = _run_id(stage_name, record_id)
    shards = StageShard.objects.bulk_create([
        StageShard(run_id=run_id, stage=stage_name, record_id=record_id, index=index, row_start=span.start,
                   row_stop=span.stop, batch_tokens=batch_tokens) for index, span in enumerate(spans)])
    for shard in shards:
        shard_enqueue(shard_id=shard.pk)
    stage_note(stage_name=stage_name, record_id=record_id,
               line=f"split into {len(spans)} shards of {', '.join(str(len(s)) for s in spans)} rows")
    runs_changed(run_ids=[run_id])
    return shards


@transaction.atomic
def shards_resume(*, stage_name: str, record_id: int) -> list[int]:
    """A stage started again (Retry, or a lost merge): its shards that failed or were cancelled are queued
    again and sent, as are queued ones (their message may be gone); succeeded and running ones stay.
    Returns the indices sent."""
    from runs.pipeline.dispatch.queue import shard_enqueue

    shards = list(shards_of(stage_name=stage_name, record_id=record_id).select_for_update().exclude(
        status__in=[StageStatus.SUCCEEDED, StageStatus.RUNNING]))
    for shard in shards:
        StageShard.objects.filter(pk=shard.pk).update(
            status=StageStatus.QUEUED, worker="", lease_expires_at=None, error="", finished_at=None,
            log_tail=log_appended(shard.log_tail, "queued again with its stage")[-LOG_CHARS:])
        shard_enqueue(shard_id=shard.pk)
    if shards:
        kept = shards_of(stage_name=stage_name, record_id=record_id).filter(status=StageStatus.SUCCEEDED).count()
        stage_note(stage_name=stage_name, record_id=record_id,
                   line=f"shards {', '.join(str(s.index) for s in shards)} sent again; {kept} that succeeded kept")
        runs_changed(run_ids=[shards[0].run_id])
    return [shard.index for shard in shards]


@transaction.atomic
def shard_start(*, stage_name: str, record_id: int, index: int, worker: str) -> StageShard | None:
    """Mark a queued shard running for `worker`; None when it is not queued (a copy of its message, or
    cancelled) or its stage was cancelled or is done (then the shard is cancelled). A stage that another
    shard failed still has its shards run: Retry then sends only that one."""
    shard = shards_of(stage_name=stage_name, record_id=record_id).select_for_update().filter(index=index).first()
    if shard is None or shard.status != StageStatus.QUEUED:
        return None
    if not _stage_rows(stage_name, record_id).exclude(status__in=[StageStatus.CANCELLED, StageStatus.SUCCEEDED]).exists():
        StageShard.objects.filter(pk=shard.pk).update(status=StageStatus.CANCELLED, finished_at=timezone.now(),
                                                      worker="", lease_expires_at=None)
        return None
    shard.status, shard.worker, shard.started_at = StageStatus.RUNNING, worker[:200], timezone.now()
    shard.attempts += 1
    shard.lease_expires_at, shard.finished_at, shard.rows_done, shard.error = _lease_end(), None, 0, ""
    shard.log_tail = log_appended(shard.log_tail, f"attempt {shard.attempts} started on {shard.worker}")[-LOG_CHARS:]
    shard.save()
    runs_changed(run_ids=[shard.run_id])
    return shard


def _running(stage_name: str, record_id: int, index: int, started_at: datetime):
    return shards_of(stage_name=stage_name, record_id=record_id).filter(
        index=index, started_at=started_at, status=StageStatus.RUNNING)


def _stage_lease_renew(stage_name: str, record_id: int) -> None:
    _stage_rows(stage_name, record_id).filter(status=StageStatus.RUNNING).update(lease_expires_at=_lease_end())


def shard_heartbeat(*, stage_name: str, record_id: int, index: int, started_at: datetime) -> bool:
    """Renew the shard's lease and its stage's; False once the shard is no longer this attempt's."""
    if not _running(stage_name, record_id, index, started_at).update(lease_expires_at=_lease_end()):
        return False
    _stage_lease_renew(stage_name, record_id)
    return True


def shard_progress(*, stage_name: str, record_id: int, index: int, started_at: datetime, rows_done: int,
                   log_tail: str, prefix: str = "") -> None:
    """Raises StageCancelled once the shard is no longer running for this attempt (cancelled, sent again)."""
    tail = f"{prefix}\n{log_tail}" if prefix else log_tail
    if not _running(stage_name, record_id, index, started_at).update(
            rows_done=rows_done, log_tail=tail[-LOG_CHARS:], lease_expires_at=_lease_end()):
        raise StageCancelled(f"shard {index} of {stage_name} {record_id} is no longer running")
    # The stage's own progress is its shards' together.
    counted = shards_of(stage_name=stage_name, record_id=record_id).aggregate(
        done=Sum("rows_done"), total=Sum(F("row_stop") - F("row_start")))
    _stage_rows(stage_name, record_id).filter(status=StageStatus.RUNNING).update(
        lease_expires_at=_lease_end(), progress_done=counted["done"] or 0, progress_total=counted["total"] or 0)
    runs_changed(run_ids=[_run_id(stage_name, record_id)], progress=True)


@transaction.atomic
def shard_succeed(*, stage_name: str, record_id: int, index: int, started_at: datetime, result: dict,
                  log_tail: str) -> bool:
    """Record the shard's result; True when it is the last of its stage's shards to succeed while the
    stage runs, so that its worker merges them. The stage row is locked first: two shards ending at
    once are decided one after the other, and exactly one of them sees every shard succeeded."""
    stage = _stage_rows(stage_name, record_id).select_for_update().first()
    shard = _running(stage_name, record_id, index, started_at).first()
    if shard is None:
        raise StageCancelled(f"shard {index} of {stage_name} {record_id} was cancelled before it could finish")
    StageShard.objects.filter(pk=shard.pk).update(
        status=StageStatus.SUCCEEDED, finished_at=timezone.now(), lease_expires_at=None, result=result,
        rows_done=shard.rows, log_tail=log_tail[-LOG_CHARS:])
    runs_changed(run_ids=[shard.run_id])
    return (stage is not None and stage.status == StageStatus.RUNNING and not shards_of(
        stage_name=stage_name, record_id=record_id).exclude(status=StageStatus.SUCCEEDED).exists())


def shard_fail(*, stage_name: str, record_id: int, index: int, started_at: datetime, error: str, log_tail: str,
               cancelled: bool = False, failure=None, trace: str = "") -> None:
    """Record the shard's end; a failure (not a cancel) fails its stage, naming the shard, its rows and
    its worker, before `error` (the sentence of workers.contract.failures' `failure`; `trace` for developers)."""
    with transaction.atomic():
        shard = _running(stage_name, record_id, index, started_at).select_for_update().first()
        if shard is None:
            return  # sent again or cancelled meanwhile: this attempt's end is nobody's news
        status = StageStatus.CANCELLED if cancelled else StageStatus.FAILED
        shown = f"{error}\n\n{trace}" if trace else error
        StageShard.objects.filter(pk=shard.pk).update(status=status, finished_at=timezone.now(),
                                                      lease_expires_at=None, error=shown[-LOG_CHARS:],
                                                      log_tail=log_tail[-LOG_CHARS:])
        runs_changed(run_ids=[shard.run_id])
        if cancelled:
            return
        stage = _stage_rows(stage_name, record_id).first()
        stage_fail(stage_name=stage_name, record_id=record_id,
                   error=f"shard {index} ({shard.span_label}) failed on worker {shard.worker}: {error}",
                   failure=failure, trace=trace, log_tail=log_appended(stage.log_tail if stage else "",
                                      f"shard {index} ({shard.span_label}) failed on {shard.worker}")[-LOG_CHARS:])
