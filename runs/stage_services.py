"""Writes that workers make while a stage runs: start, progress, success, failure, metrics."""
from __future__ import annotations

import json
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from runs.models import Checkpoint, Extraction, Manifest, MetricPoint, StageRecord, StageStatus
from runs.stages import STAGES, STAGES_BY_NAME


class StageCancelled(Exception):
    """The stage's row is no longer running (a user cancelled it); the worker must stop."""


def _stage_qs(stage_name: str, record_id: int):
    return STAGES_BY_NAME[stage_name].model.objects.filter(pk=record_id)


def stage_record_id(*, stage_name: str, run_id: int) -> int:
    """The row that records `stage_name` for a run (the pipeline's tasks carry run ids)."""
    return STAGES_BY_NAME[stage_name].model.objects.values_list("pk", flat=True).get(run_id=run_id)


@transaction.atomic
def stage_start(*, stage_name: str, record_id: int, worker: str = "") -> StageRecord | None:
    """Mark a queued stage running. None if it was cancelled or already ran (a redelivered task)."""
    stage = _stage_qs(stage_name, record_id).select_for_update().get()
    if stage.status != StageStatus.QUEUED:
        return None
    stage.status = StageStatus.RUNNING
    stage.started_at = timezone.now()
    stage.worker = worker[:200]
    stage.save(update_fields=["status", "started_at", "worker"])
    return stage


def stage_progress(*, stage_name: str, record_id: int, done: int, total: int, log_tail: str) -> None:
    updated = _stage_qs(stage_name, record_id).filter(status=StageStatus.RUNNING).update(
        progress_done=done, progress_total=total, log_tail=log_tail
    )
    if not updated:
        raise StageCancelled(f"{stage_name} {record_id} is no longer running")


def stage_succeed(*, stage_name: str, record_id: int, fields: dict, log_tail: str) -> None:
    updated = _stage_qs(stage_name, record_id).filter(status=StageStatus.RUNNING).update(
        status=StageStatus.SUCCEEDED, finished_at=timezone.now(), log_tail=log_tail, **fields
    )
    if not updated:
        raise StageCancelled(f"{stage_name} {record_id} was cancelled before it could finish")


@transaction.atomic
def stage_fail(*, stage_name: str, record_id: int, error: str, log_tail: str, cancelled: bool = False) -> None:
    """Record the failure and, for a pipeline stage, cancel the stages after it, saying why."""
    now = timezone.now()
    status = StageStatus.CANCELLED if cancelled else StageStatus.FAILED
    _stage_qs(stage_name, record_id).filter(status__in=[StageStatus.RUNNING, StageStatus.QUEUED]).update(
        status=status, finished_at=now, error=error[-20000:], log_tail=log_tail
    )
    run_id = _stage_qs(stage_name, record_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return
    names = [stage.name for stage in STAGES]
    for later in names[names.index(stage_name) + 1 :]:
        STAGES_BY_NAME[later].model.objects.filter(run_id=run_id, status=StageStatus.QUEUED).update(
            status=StageStatus.CANCELLED, finished_at=now, error=f"not started: {stage_name} did not succeed"
        )


def manifest_record(*, run_id: int, path: Path) -> Manifest:
    extraction = Extraction.objects.get(run_id=run_id)
    data = json.loads(Path(path).read_text())
    version = str(data.get("data_format_version", data.get("version", "")))
    manifest, _ = Manifest.objects.update_or_create(
        extraction=extraction, defaults={"path": str(path), "format_version": version, "data": data}
    )
    return manifest


def metrics_record(*, training_run_id: int, points: list[dict]) -> int:
    rows = [
        MetricPoint(
            training_run_id=training_run_id,
            split=p["split"],
            key=p["key"],
            step=int(p["step"]),
            epoch=float(p["epoch"]),
            value=float(p["value"]),
        )
        for p in points
    ]
    MetricPoint.objects.bulk_create(rows, batch_size=1000)
    return len(rows)


@transaction.atomic
def checkpoints_register(*, training_run_id: int, checkpoints: list[dict]) -> list[Checkpoint]:
    saved = []
    for ckpt in checkpoints:
        row, _ = Checkpoint.objects.update_or_create(
            training_run_id=training_run_id,
            epoch=ckpt["epoch"],
            defaults={
                "path": str(ckpt["path"]),
                "train_loss": ckpt.get("train_loss"),
                "val_loss": ckpt.get("val_loss"),
                "val_metrics": ckpt.get("val_metrics") or {},
                "is_best": bool(ckpt.get("is_best")),
            },
        )
        saved.append(row)
    return saved
