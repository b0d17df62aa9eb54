"""What each stage's worker records once the stage succeeded: the typed result on the stage's row and the
artifacts it wrote (extraction and manifest, checkpoints, measurements), then what follows from them (the
best checkpoint, a serve check). Its own module, apart from the stage lifecycle (start, progress, lease,
failure) in runs.pipeline.lifecycle.stage_services, through whose stage_succeed each result lands.
"""
from __future__ import annotations

import json
import logging
from dataclasses import fields as dataclass_fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from django.db import models, transaction
from django.utils import timezone

from runs.data.extractions import extraction_verify
from runs.checkpoints.models import Checkpoint, Evaluation
from runs.data.models import Extraction, Manifest, Verification
from runs.pipeline.jobs.models import ServeCheck
from runs.pipeline.models import ExtractStage, PipelineRun, Preparation, TrainingRun, VocabMapping
from runs.pipeline.status.list_tau import run_list_tau_refresh
from runs.pipeline.lifecycle import signals
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.data.curation import CatalogueCounts
from runs.pipeline.best import best_decide, checkpoint_run_id, tau_on_the_same_prompts
from runs.pipeline.status.changes import training_changed
from runs.pipeline.status.live_tau import live_tau_request
from runs.pipeline.online.selectors import OnlineCaptured
from runs.pipeline.lifecycle.stage_services import stage_succeed
from runs.checkpoints.serve_check_services import serve_check_request
from runs.checkpoints.generation_services import generations_record
from runs.pipeline.status.upstream_commands import recorded_speculative_tokens

if TYPE_CHECKING:  # the stages import torch; these services only read their dataclasses
    from workers.stages.evaluate.measure import EvaluationResult
    from workers.stages.extract.output.result import ExtractionResult
    from workers.stages.prepare.stage import PrepareResult
    from workers.stages.evaluate.serve_check import ServeCheckResult
    from workers.stages.train.results import TrainResult
    from workers.stages.vocab import VocabResult

logger = logging.getLogger(__name__)


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
    """The measurement, then the best checkpoint of the run it measured (runs.pipeline.best: by our τ, known
    once the run's evaluate stage has measured every checkpoint); for a run that asked for it, a serve
    check of that best on the same prompts (_best_serve_check)."""
    with transaction.atomic():
        stage_succeed(stage_name="evaluate", record_id=record_id, fields=result_columns(Evaluation, result),
                      log_tail=log_tail, started_at=started_at)
        evaluation = Evaluation.objects.select_related("run", "checkpoint").get(pk=record_id)
        generations_record(evaluation=evaluation, generations=result.generations)
        best = best_decide(run_id=evaluation.run_id or checkpoint_run_id(evaluation.checkpoint_id))
        if evaluation.run_id is not None:
            run_list_tau_refresh(run_id=evaluation.run_id)  # the stage's τ, where no best moved
            signals.tau_recorded.send(sender=PipelineRun, run_id=evaluation.run_id)
        _best_serve_check(run_id=evaluation.run_id or checkpoint_run_id(evaluation.checkpoint_id),
                          best=best or (evaluation.checkpoint if evaluation.run_id else None))


def _best_serve_check(*, run_id: int | None, best: Checkpoint | None) -> None:
    """A run that asked for a serve check gets one of the checkpoint its rule chose, once its evaluate
    stage succeeded, and of the new best whenever a later measurement moves it: vLLM's figure shows
    beside ours for the checkpoint the run offers. The best may be another checkpoint than the one the
    run's row measured: the check serves it with that row's prompts and settings, which the stage measured
    every checkpoint with (serve_check_record takes that checkpoint's own τ as ours). Asked once per
    checkpoint: a finished or failed check of it is not asked again."""
    run = PipelineRun.objects.filter(pk=run_id).select_related("evaluation").first() if run_id else None
    stage = getattr(run, "evaluation", None) if run is not None else None
    if (best is None or stage is None or stage.status != StageStatus.SUCCEEDED
            or not (run.config or {}).get("serve_check")):
        return
    if not ServeCheck.objects.filter(checkpoint=best, evaluation=stage).exists():
        serve_check_request(checkpoint=best, user=None, evaluation=stage)


def measured_alongside_record(*, measured: Evaluation, checkpoint_id: int, result: EvaluationResult,
                              prompts_path: str | None = None, suite: str = "") -> Evaluation:
    """A measurement the pipeline's evaluate stage made of one of the run's other checkpoints, beside
    `measured` (the run's own) and on its prompts: it records the settings it was made with, so that
    a serve check starting from it (runs.checkpoints.serve_check_services) derives the same prompt
    list, not the first max_prompts' default of them. On one of the run's evaluation suites: `prompts_path`
    its file, `suite` its name."""
    with transaction.atomic():
        evaluation = Evaluation.objects.create(checkpoint_id=checkpoint_id, status=StageStatus.SUCCEEDED,
                                               finished_at=timezone.now(), suite=suite,
                                               prompts_path=measured.prompts_path if prompts_path is None else prompts_path,
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
    (our definition) minus ours. It chooses nothing: the best is chosen by our τ alone, measured on every
    checkpoint (runs.pipeline.best), and the run page shows vLLM's figure beside it."""
    check = ServeCheck.objects.select_related("evaluation").get(pk=record_id)
    ours = tau_on_the_same_prompts(checkpoint_id=check.checkpoint_id, evaluation=check.evaluation)
    fields = {**result_columns(ServeCheck, result), "tau": ours,
              "tau_difference": None if ours is None else result.vllm_tau_emitted - ours}
    stage_succeed(stage_name="serve_check", record_id=record_id, fields=fields, log_tail=log_tail,
                  started_at=started_at)


def demo_build_record(*, record_id: int, result, log_tail: str, started_at: datetime | None = None) -> None:
    stage_succeed(stage_name="demo_build", record_id=record_id, log_tail=log_tail, started_at=started_at,
                  fields={"initial_loss": result.initial_loss, "final_loss": result.final_loss})


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
    "demo_build": demo_build_record,
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
        row, created = Checkpoint.objects.update_or_create(
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
        if created:  # measured now, on the evaluate queue, when the run measures τ while training
            live_tau_request(checkpoint=row)
    if saved:
        training_changed(training_run_id=training_run_id)  # the run page's checkpoints (runs.pipeline.status.changes)
    return saved
