"""The shard rows (issue 36) as the stage services see them: below runs.pipeline.shards.services, which
records with those services, so that they can ask about and end a stage's shards without importing it back."""
from __future__ import annotations

from django.utils import timezone

from runs.pipeline.status.changes import runs_changed
from runs.pipeline.shards.models import StageShard
from runs.pipeline.lifecycle.stage_record import StageStatus

LIVE = (StageStatus.QUEUED, StageStatus.RUNNING)


def shards_of(*, stage_name: str, record_id: int):
    return StageShard.objects.filter(stage=stage_name, record_id=record_id).order_by("index")


def shards_cancel(*, stage_name: str, record_id: int) -> int:
    """End a cancelled stage's queued and running shards (their workers stop at their next progress report)."""
    shards = shards_of(stage_name=stage_name, record_id=record_id).filter(status__in=LIVE)
    run_id = shards.values_list("run_id", flat=True).first()
    done = shards.update(status=StageStatus.CANCELLED, finished_at=timezone.now(), lease_expires_at=None)
    if done:
        runs_changed(run_ids=[run_id])
    return done


def stages_with_live_shards(stage_name: str):
    """Record ids of `stage_name` rows that have a shard queued or running (their shards keep them alive)."""
    return StageShard.objects.filter(stage=stage_name, status__in=LIVE).values_list("record_id", flat=True)
