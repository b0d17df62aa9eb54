"""The reconcilers' care of shards (issue 36), as stages_reconcile and claims_reconcile care for stages:
a running shard whose worker stopped renewing its lease (SIGKILLed, host gone), and a queued one whose
message a worker took and died holding, are sent to the queue again. Attempts are counted: a shard lost
MAX_ATTEMPTS times fails its stage, saying why. The shard's log and its stage's log say what happened.
Safe to run from every worker's reconciler at once (rows are taken with skip_locked)."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from runs.pipeline.status.changes import runs_changed
from runs.pipeline.dispatch.message_claims import CLAIM_SECONDS, claimer_alive
from runs.pipeline.dispatch.queue import shard_enqueue
from runs.pipeline.shards.models import StageShard
from runs.pipeline.shards.services import LOG_CHARS, log_appended, stage_note
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.lifecycle.stage_services import MAX_ATTEMPTS, stage_fail

logger = logging.getLogger(__name__)


def _lost(shard: StageShard, now) -> list[str]:
    expired = timezone.localtime(shard.lease_expires_at or now)
    why = f"worker {shard.worker or '?'} stopped answering (its lease expired at {expired:%H:%M:%S})"
    where = f"shard {shard.index} ({shard.span_label})"
    if shard.attempts >= MAX_ATTEMPTS:
        error = f"{where} lost its worker {shard.attempts} times; gave up: {why}"
        StageShard.objects.filter(pk=shard.pk).update(
            status=StageStatus.FAILED, finished_at=now, lease_expires_at=None, error=error,
            log_tail=log_appended(shard.log_tail, f"attempt {shard.attempts} lost: {why}; gave up")[-LOG_CHARS:])
        stage_fail(stage_name=shard.stage, record_id=shard.record_id, error=error, log_tail=_stage_log(shard))
        return [f"{shard} failed: {error}"]
    StageShard.objects.filter(pk=shard.pk).update(
        status=StageStatus.QUEUED, worker="", lease_expires_at=None, started_at=None, rows_done=0,
        log_tail=log_appended(shard.log_tail, f"attempt {shard.attempts} lost: {why}; sent again")[-LOG_CHARS:])
    stage_note(stage_name=shard.stage, record_id=shard.record_id, line=f"{where} sent again: {why}")
    shard_enqueue(shard_id=shard.pk)
    return [f"{shard} sent again (attempt {shard.attempts + 1} of {MAX_ATTEMPTS}): {why}"]


def _stage_log(shard: StageShard) -> str:
    from runs.pipeline.lifecycle.stages import STAGES_BY_NAME

    row = STAGES_BY_NAME[shard.stage].model.objects.filter(pk=shard.record_id).values_list("log_tail", flat=True)
    return (row.first() or "")


def shards_reconcile() -> list[str]:
    """Send again the shards whose worker was lost; returns what it did, in words."""
    now = timezone.now()
    done: list[str] = []
    lapsed = StageShard.objects.filter(status=StageStatus.RUNNING, lease_expires_at__lt=now)
    for pk in lapsed.values_list("pk", flat=True):
        with transaction.atomic():
            shard = StageShard.objects.select_for_update(skip_locked=True).filter(
                pk=pk, status=StageStatus.RUNNING, lease_expires_at__lt=now).first()
            if shard is not None:
                done += _lost(shard, now)
                runs_changed(run_ids=[shard.run_id])
    claimed = StageShard.objects.filter(status=StageStatus.QUEUED, lease_expires_at__lt=now).exclude(worker="")
    for pk in claimed.values_list("pk", flat=True):
        with transaction.atomic():
            shard = StageShard.objects.select_for_update(skip_locked=True).filter(
                pk=pk, status=StageStatus.QUEUED, lease_expires_at__lt=now).exclude(worker="").first()
            if shard is None:
                continue
            if claimer_alive(shard.worker, shard.lease_expires_at - timedelta(seconds=CLAIM_SECONDS), now):
                StageShard.objects.filter(pk=pk).update(lease_expires_at=now + timedelta(seconds=CLAIM_SECONDS))
                continue  # its worker lives: the message waits there for a free slot
            why = f"worker {shard.worker} took its message and was lost before starting it"
            StageShard.objects.filter(pk=pk).update(
                worker="", lease_expires_at=None, log_tail=log_appended(shard.log_tail, f"{why}; sent again")[-LOG_CHARS:])
            stage_note(stage_name=shard.stage, record_id=shard.record_id,
                       line=f"shard {shard.index} ({shard.span_label}) sent again: {why}")
            shard_enqueue(shard_id=shard.pk)
            done.append(f"{shard} sent again: {why}")
    for line in done:
        logger.warning("reconciled: %s", line)
    return done
