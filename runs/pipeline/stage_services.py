"""Writes that workers make while a stage runs: start, progress, the typed result of each stage,
failure, metrics; and the pipeline's rules between stages (what gates training, what follows an
extraction)."""
from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from dataclasses import fields as dataclass_fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from runs.alerts import events as alert_events
from runs.data.extractions import extraction_training_gate, extraction_verify
from runs.models import (
    Checkpoint,
    Evaluation,
    ExtractStage,
    Extraction,
    Manifest,
    Preparation,
    ServeCheck,
    StageAttempt,
    StageRecord,
    StageStatus,
    TrainingRun,
    Verification,
    VocabMapping,
)
from runs.data.curation import CatalogueCounts
from runs.tracking.services import metrics_truncate
from runs.pipeline.best import best_decide, checkpoint_run_id, tau_on_the_same_prompts
from runs.pipeline.changes import training_changed
from runs.pipeline.online import OnlineCaptured, run_id_is_online
from runs.pipeline.stages import JOBS, STAGES, STAGES_BY_NAME
from runs.checkpoints.serve_check_services import serve_check_request
from runs.checkpoints.generation_services import generations_record
from runs.pipeline.upstream_commands import recorded_speculative_tokens
from runs.sweeps.release import sweep_release_after

if TYPE_CHECKING:  # the stages import torch; these services only read their dataclasses
    from workers.stages.evaluate.measure import EvaluationResult
    from workers.stages.extract.with_transformers import ExtractionResult
    from workers.stages.prepare import PrepareResult
    from workers.stages.evaluate.serve_check import ServeCheckResult
    from workers.stages.train.loop import TrainResult
    from workers.stages.vocab import VocabResult

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
    """Mark a queued stage running. None if it was cancelled or already ran (a redelivered task), or
    if the pipeline's rules refuse to start it (then it is failed with the reason)."""
    stage = _stage_qs(stage_name, record_id).select_for_update().get()
    if stage.status != StageStatus.QUEUED:
        return None
    if stage_name == "train":
        # Nobody trains on hidden states that disagree with their manifest, unless a reviewer said why.
        extraction = Extraction.objects.filter(produced_by__run_id=stage.run_id).first()
        # An online run has none: its training asks capture servers (runs.pipeline.online).
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
    from runs.pipeline.queue import evaluation_enqueue, job_enqueue, pipeline_enqueue

    now = timezone.now()
    legacy = now - timedelta(seconds=settings.EAGLE3WEB_STAGE_LEASE_SECONDS)
    lapsed = Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True, started_at__lt=legacy)
    done = []
    for kind in (*STAGES, *JOBS):
        rows = kind.model.objects.filter(lapsed, status=StageStatus.RUNNING)
        if kind.related_name:  # a run trained elsewhere holds no lease: its client, not a worker, runs it
            rows = rows.exclude(run__external=True)
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
                alert_events.worker_lost(stage_name=kind.name, record_id=pk, run_id=getattr(row, "run_id", None),
                                         worker=row.worker, attempt=attempts)
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
        sweep_release_after(run_id=run_id)  # the run is done: its sweep's next run goes to the queue

    elif HAND_OVER_NEXT.get():
        from runs.pipeline.queue import pipeline_enqueue

        pipeline_enqueue(run_id=run_id)  # the outbox row commits with the success, or neither does

@transaction.atomic
def stage_fail(*, stage_name: str, record_id: int, error: str, log_tail: str, cancelled: bool = False,
               started_at: datetime | None = None) -> None:
    """Record the failure and, for a pipeline stage, cancel the stages after it, saying why."""
    now = timezone.now()
    status = StageStatus.CANCELLED if cancelled else StageStatus.FAILED
    updated = _stage_qs(stage_name, record_id, started_at).filter(
        status__in=[StageStatus.RUNNING, StageStatus.QUEUED]).update(
        status=status, finished_at=now, error=error[-20000:], log_tail=log_tail, lease_expires_at=None
    )
    _attempt_close(stage_name=stage_name, record_id=record_id, outcome=status, log_tail=log_tail, error=error[-20000:],
                   started_at=started_at)
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
        alert_events.run_failed(run_id=run_id, stage_name=stage_name, error=error)
    sweep_release_after(run_id=run_id)  # the run is over: its sweep's next run goes to the queue


def result_columns(model: type[models.Model], result) -> dict:
    """Every field of a stage's result dataclass that a row (the stage's, or the artifact it wrote)
    has a column of the same name for, so that nothing the stage counted is lost on the way to the page."""
    columns = {f.name for f in model._meta.concrete_fields} - {"id", "run", "status", "error", "log_tail"}
    values = {}
    for f in dataclass_fields(result):
        if f.name in columns:
            value = getattr(result, f.name)
            values[f.name] = str(value) if isinstance(value, Path) else value
    return values


def preparation_record(*, record_id: int, result: PrepareResult, log_tail: str,
                       started_at: datetime | None = None) -> None:
    stage_succeed(stage_name="prepare", record_id=record_id, fields=result_columns(Preparation, result), log_tail=log_tail,
                  started_at=started_at)


@transaction.atomic
def extraction_record(*, record_id: int, result: ExtractionResult | OnlineCaptured, log_tail: str,
                      started_at: datetime | None = None) -> Extraction | None:
    """The stage's measurements on its row; the files it wrote as its Extraction (the same one again
    when the stage is retried), with their manifest and verification, which gates training. All or
    nothing: a stage cancelled meanwhile leaves no artifact behind. An online run's stage wrote nothing:
    its note and cache folder only."""
    if isinstance(result, OnlineCaptured):
        stage_succeed(stage_name="extract", record_id=record_id, fields={"out_dir": result.cache_dir},
                      log_tail="\n".join(filter(None, (log_tail, result.note))), started_at=started_at)
        return None
    stage = ExtractStage.objects.select_related("run__preparation").get(pk=record_id)
    extraction, _ = Extraction.objects.update_or_create(
        produced_by=stage,
        defaults={"target_id": stage.target_id, "path": str(result.out_dir), **result_columns(Extraction, result)},
    )
    manifest_record(extraction=extraction, path=Path(result.manifest_path))
    verification = extraction_verify(extraction=extraction)
    if not extraction.layout:
        extraction.layout = verification.layout
        extraction.save(update_fields=["layout"])
    logger.info("extraction %s verification %s: %d checks in %.2f s", extraction.pk,
                "passed" if verification.passed else "FAILED", len(verification.checks), verification.seconds)
    stage_succeed(stage_name="extract", record_id=record_id, fields=result_columns(ExtractStage, result),
                  log_tail=log_tail, started_at=started_at)
    return extraction


def vocab_mapping_record(*, record_id: int, result: VocabResult, log_tail: str,
                         started_at: datetime | None = None) -> None:
    stage_succeed(stage_name="vocab", record_id=record_id, fields=result_columns(VocabMapping, result), log_tail=log_tail,
                  started_at=started_at)


def training_record(*, record_id: int, result: TrainResult, log_tail: str,
                    started_at: datetime | None = None) -> None:
    """The training's counts and split, and its checkpoints with the trainer's best marked: the lowest
    validation loss, provisional under best_by "tau" until the evaluate stage measured them all
    (runs.pipeline.best)."""
    from dataclasses import asdict

    checkpoints_register(training_run_id=record_id, checkpoints=[asdict(c) for c in result.checkpoints])
    fields = {**result_columns(TrainingRun, result), "split": result.split.as_dict()}
    stage_succeed(stage_name="train", record_id=record_id, fields=fields, log_tail=log_tail,
                  started_at=started_at)


def evaluation_record(*, record_id: int, result: EvaluationResult, log_tail: str,
                      started_at: datetime | None = None) -> None:
    """The measurement, then the best checkpoint of the run it measured (runs.pipeline.best: by τ, known
    once the run's evaluate stage has measured every checkpoint); for a run that asked for it, a serve
    check of that best on the same prompts."""
    with transaction.atomic():
        stage_succeed(stage_name="evaluate", record_id=record_id, fields=result_columns(Evaluation, result),
                      log_tail=log_tail, started_at=started_at)
        evaluation = Evaluation.objects.select_related("run", "checkpoint").get(pk=record_id)
        generations_record(evaluation=evaluation, generations=result.generations)
        best = best_decide(run_id=evaluation.run_id or checkpoint_run_id(evaluation.checkpoint_id))
        if evaluation.run_id is not None:
            alert_events.tau_recorded(run_id=evaluation.run_id)
        if evaluation.run is not None and (evaluation.run.config or {}).get("serve_check") and evaluation.checkpoint:
            # The best by τ may be another checkpoint than the one this row measured: the check serves it with
            # this row's prompts and settings, which the stage measured every checkpoint with (serve_check_record
            # takes that checkpoint's own τ as ours).
            serve_check_request(checkpoint=best or evaluation.checkpoint, user=None, evaluation=evaluation)


def measured_alongside_record(*, measured: Evaluation, checkpoint_id: int, result: EvaluationResult) -> Evaluation:
    """A measurement the pipeline's evaluate stage made of one of the run's other checkpoints, beside
    `measured` (the run's own) and on its prompts: it records the settings it was made with, so that
    a serve check starting from it (runs.checkpoints.serve_check_services) derives the same prompt
    list, not the first max_prompts' default of them."""
    with transaction.atomic():
        evaluation = Evaluation.objects.create(checkpoint_id=checkpoint_id, status=StageStatus.SUCCEEDED,
                                               finished_at=timezone.now(), prompts_path=measured.prompts_path,
                                               max_prompts=measured.max_prompts, **result_columns(Evaluation, result))
        generations_record(evaluation=evaluation, generations=result.generations)
    return evaluation


def catalogue_record(*, record_id: int, result: CatalogueCounts, log_tail: str,
                     started_at: datetime | None = None) -> None:
    stage_succeed(stage_name="catalogue", record_id=record_id, log_tail=log_tail, started_at=started_at,
                  fields={"samples_added": result.added, "samples_total": result.total})


def verification_request_record(*, record_id: int, result: Verification, log_tail: str,
                                started_at: datetime | None = None) -> None:
    stage_succeed(stage_name="verify", record_id=record_id, log_tail=log_tail, started_at=started_at,
                  fields={"verification": result})


def serve_check_record(*, record_id: int, result: ServeCheckResult, log_tail: str,
                       started_at: datetime | None = None) -> None:
    """What vLLM said, beside our τ on the same prompts (the evaluation's): vLLM's emitted-token τ
    (our definition) minus ours; then the best checkpoint of the run that trained it, vLLM's τ counting
    before ours (runs.pipeline.best)."""
    check = ServeCheck.objects.select_related("evaluation").get(pk=record_id)
    ours = tau_on_the_same_prompts(checkpoint_id=check.checkpoint_id, evaluation=check.evaluation)
    fields = {**result_columns(ServeCheck, result), "tau": ours,
              "tau_difference": None if ours is None else result.vllm_tau_emitted - ours}
    with transaction.atomic():
        stage_succeed(stage_name="serve_check", record_id=record_id, fields=fields, log_tail=log_tail,
                      started_at=started_at)
        run_id = checkpoint_run_id(check.checkpoint_id)
        best_decide(run_id=run_id)
        if run_id is not None:
            alert_events.tau_recorded(run_id=run_id)  # vLLM's τ may be the run's τ now (runs.pipeline.best)


# What each stage's (and job's) worker records once it succeeded.
STAGE_RECORDERS = {
    "prepare": preparation_record,
    "extract": extraction_record,
    "vocab": vocab_mapping_record,
    "train": training_record,
    "evaluate": evaluation_record,
    "catalogue": catalogue_record,
    "verify": verification_request_record,
    "serve_check": serve_check_record,
}


def manifest_record(*, extraction: Extraction, path: Path) -> Manifest:
    data = json.loads(Path(path).read_text())
    version = str(data.get("data_format_version", data.get("version", "")))
    manifest, _ = Manifest.objects.update_or_create(
        extraction=extraction, defaults={"path": str(path), "format_version": version, "data": data}
    )
    return manifest


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
                "speculative_tokens": recorded_speculative_tokens(Path(ckpt["path"])),
            },
        )
        saved.append(row)
    if saved:
        training_changed(training_run_id=training_run_id)  # the run page's checkpoints (runs.pipeline.changes)
    return saved
