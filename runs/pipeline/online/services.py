"""Writes of online runs (issue 27): "keep the cache", an online run's cache turned into the run's own
extraction for reuse (asked for on the run page or the API; written by a worker: workers.orchestration.online_tasks).

Its state lives in the training's supply figures, under "kept": {"status": queued | running |
succeeded | failed, "error", "extraction_id", "path", "requested_by"}; the run page shows it
(runs.pipeline.online.selectors.supply_dict)."""
from __future__ import annotations

import logging
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from eagle3web.celery import celery_app
from runs.data.extractions import extraction_verify
from runs.data.models import Extraction
from runs.pipeline.models import ExtractStage, PipelineRun, TrainingRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.online.selectors import KEPT_DIRNAME, cache_dir, cache_rows_present, is_online
from runs.pipeline.dispatch.routing import stage_queue
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.lifecycle.result_records import manifest_record, result_columns
from runs.roles import require_on_run

logger = logging.getLogger(__name__)

KEEP_TASK = "eagle3web.keep_cache"  # workers.orchestration.online_tasks.keep_cache_task


def _kept_set(*, training_id: int, kept: dict) -> None:
    training = TrainingRun.objects.select_for_update().get(pk=training_id)
    TrainingRun.objects.filter(pk=training_id).update(supply={**(training.supply or {}), "kept": kept})


def _kept(training: TrainingRun) -> dict:
    return dict((training.supply or {}).get("kept") or {})


@transaction.atomic
def online_keep_request(*, run: PipelineRun, user: AbstractBaseUser) -> None:
    """Ask a worker to write the online run's cache as its extraction. Refused, nothing stored, unless the
    run is online, its training succeeded, nothing is kept or being kept already, and the cache holds a
    file for every prepared row (the worker then checks each file whole before writing anything)."""
    require_on_run(user, run, "launch")
    if run.external or not is_online(run.config):
        raise RunConfigError(f"{run} is not an online run: its hidden states are an extraction already")
    training = TrainingRun.objects.select_for_update().get(run=run)
    if training.status != StageStatus.SUCCEEDED:
        raise RunConfigError(f"{run}'s training has not succeeded: its cache is kept once it has")
    kept = _kept(training)
    if kept.get("status") in ("queued", "running", "succeeded"):
        raise RunConfigError(f"{run}'s cache is {kept['status']} already"
                             + (f" (extraction {kept['extraction_id']})" if kept.get("extraction_id") else ""))
    rows = run.preparation.num_rows or 0
    present = cache_rows_present(output_dir=run.output_dir, num_rows=rows)
    if present < rows:
        raise RunConfigError(
            f"the cache holds {present} of {rows} prepared rows: {rows - present} missing (evicted to stay under "
            f"{run.config.get('hidden_states_cache_gib')} GiB, or never asked for); only a cache that holds every "
            "row can be kept")
    _kept_set(training_id=training.pk, kept={"status": "queued", "requested_by": user.pk})
    queue = stage_queue(stage_name="train", config=run.config)  # the worker whose disk holds the cache
    transaction.on_commit(lambda: _send(run_id=run.pk, queue=queue))


def _send(*, run_id: int, queue: str) -> None:
    try:
        celery_app.send_task(KEEP_TASK, args=[run_id], queue=queue)
    except Exception as exc:  # noqa: BLE001 - the broker away: said on the run page; the button asks again
        logger.warning("keeping run %s's cache: the broker refused the task: %s", run_id, exc)
        online_keep_fail(run_id=run_id, error=f"the queue did not take the request ({exc}); ask again")


@transaction.atomic
def online_keep_plan(*, run_id: int) -> dict | None:
    """The keep's arguments (workers.stages.train.online.keep.keep_cache_as_extraction), marking it running;
    None when it is not queued (a redelivered task, or kept already)."""
    training = TrainingRun.objects.select_for_update(of=("self",)).select_related(
        "run__target", "run__preparation", "run__extract_stage").get(run_id=run_id)
    kept = _kept(training)
    if kept.get("status") != "queued":
        return None
    _kept_set(training_id=training.pk, kept={**kept, "status": "running"})
    run = training.run
    return {"cache_dir": cache_dir(run.output_dir), "target_dir": Path(run.target.path),
            "prepared_dir": Path(run.preparation.out_dir), "out_dir": Path(run.output_dir) / KEPT_DIRNAME,
            "layer_ids": list(run.extract_stage.layer_ids), "hidden_size": run.target.hidden_size}


@transaction.atomic
def online_keep_fail(*, run_id: int, error: str) -> None:
    training = TrainingRun.objects.select_for_update().get(run_id=run_id)
    _kept_set(training_id=training.pk, kept={**_kept(training), "status": "failed", "error": error[-2000:]})


@transaction.atomic
def online_keep_record(*, run_id: int, result) -> Extraction:
    """The kept folder as the run's own extraction (produced by its extract stage, as an offline run's), with
    its manifest and verification; `result` is the keep's ExtractionResult (workers.stages.extract.output.result)."""
    stage = ExtractStage.objects.select_related("run").get(run_id=run_id)
    extraction, _ = Extraction.objects.update_or_create(
        produced_by=stage,
        defaults={"target_id": stage.target_id, "path": str(result.out_dir), **result_columns(Extraction, result)})
    manifest_record(extraction=extraction, path=Path(result.manifest_path))
    requester = get_user_model().objects.filter(pk=_kept(stage.run.training_run).get("requested_by")).first()
    verification = extraction_verify(extraction=extraction, requested_by=requester)
    if not extraction.layout:
        extraction.layout = verification.layout
        extraction.save(update_fields=["layout"])
    training = TrainingRun.objects.select_for_update().get(run_id=run_id)
    _kept_set(training_id=training.pk, kept={**_kept(training), "status": "succeeded", "error": "",
                                            "extraction_id": extraction.pk, "path": str(result.out_dir)})
    return extraction
