"""Writes for the jobs users start outside a run (runs.pipeline.jobs.models): asking for one. What a worker
records when one is done is in runs.pipeline.lifecycle.result_records, beside the stages' recorders.

Asking again while one is queued returns it and hands it to the broker again (a message the broker
lost would otherwise leave it waiting for good; a duplicate is skipped by stage_start). A catalogue
pass already running is not reused: it reads the file as it was when it started."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.pipeline.jobs.models import DatasetCatalogue, DemoBuild, VerificationRequest
from runs.data.models import Dataset, Extraction
from runs.pipeline.lifecycle.stage_record import StageRecord, StageStatus
from runs.pipeline.dispatch.queue import job_enqueue, pending_enqueue
from runs.roles import require


def _queued_again_or_new(queued, *, job_name: str, create: Callable[[], StageRecord]) -> StageRecord:
    """The queued job if there is one, handed to the broker again unless it waits in the outbox
    (the broker may have lost its message); else a new one from `create`, handed over after commit."""
    pending = queued.first()
    if pending is not None:
        if pending_enqueue(kind=job_name, object_id=pending.pk) is None:  # not waiting in the outbox either
            job_enqueue(job_name=job_name, record_id=pending.pk)  # in case the broker lost its message
        return pending
    job = create()
    job_enqueue(job_name=job_name, record_id=job.pk)
    return job


@transaction.atomic
def dataset_catalogue_request(*, dataset: Dataset, user: AbstractBaseUser | None = None) -> DatasetCatalogue:
    """Queue a pass over the dataset's file that adds its new conversations to the catalogue."""
    if user is not None:
        require(user, "launch")
    Dataset.objects.select_for_update().filter(pk=dataset.pk).first()  # one request at a time per dataset
    # A running pass reads the file as it was when it started: a grown file gets a pass of its own.
    return _queued_again_or_new(
        dataset.catalogues.filter(status=StageStatus.QUEUED), job_name="catalogue",
        create=lambda: DatasetCatalogue.objects.create(dataset=dataset, requested_by=user,
                                                       size_bytes=dataset.size_bytes))


@transaction.atomic
def extraction_verify_request(*, extraction: Extraction, full: bool, user: AbstractBaseUser | None = None
                              ) -> VerificationRequest:
    """Queue a check of the extraction's files (headers; every value too when `full`)."""
    if user is not None:
        require(user, "verify")
    Extraction.objects.select_for_update().filter(pk=extraction.pk).first()
    return _queued_again_or_new(
        extraction.verification_requests.filter(status=StageStatus.QUEUED, full=full), job_name="verify",
        create=lambda: VerificationRequest.objects.create(extraction=extraction, full=full, requested_by=user))


@transaction.atomic
def demo_build_request(*, out_dir: Path, num_conversations: int, train_steps: int, seed: int = 0) -> DemoBuild | None:
    """Queue a build of the demo target and chats in out_dir, unless one finished there already
    (None: nothing to do) or one is queued or running (that one, handed to the broker again when queued).
    An interrupted build's row is queued again by the workers' reconciler once its lease lapses, and
    the build starts over (workers.stages.demo.assets writes its record of completion last)."""
    from workers.contract.demo_build import build_params, finished_build_info

    out_dir = Path(out_dir).resolve()
    if finished_build_info(out_dir, build_params(num_conversations=num_conversations, train_steps=train_steps,
                                                 seed=seed)) is not None:
        return None
    unfinished = DemoBuild.objects.select_for_update().filter(
        out_dir=str(out_dir), status__in=[StageStatus.QUEUED, StageStatus.RUNNING])
    running = unfinished.filter(status=StageStatus.RUNNING).first()
    if running is not None:
        return running
    return _queued_again_or_new(
        unfinished.filter(num_conversations=num_conversations, train_steps=train_steps, seed=seed),
        job_name="demo_build",
        create=lambda: DemoBuild.objects.create(out_dir=str(out_dir), num_conversations=num_conversations,
                                                train_steps=train_steps, seed=seed))


@transaction.atomic
def demo_build_again() -> tuple[DemoBuild | None, DemoBuild | None]:
    """Queue the newest failed demo build again, with its own folder and settings: (the failed build, the
    build queued or already under way), (None, None) when no failed build is left to redo (a later one is
    queued, running or built), (failed, None) when its folder turns out to be built after all.

    Any signed-in user may ask: nothing they send picks the folder, which `make demo` (or an admin's
    build_demo_assets) chose, and demo_build_request's lock keeps it to one build at a time."""
    from runs.data.demo import demo_build_failed

    DemoBuild.objects.select_for_update().filter(status=StageStatus.FAILED).first()  # two clicks: one build
    failed = demo_build_failed()
    if failed is None:
        return None, None
    return failed, demo_build_request(out_dir=Path(failed.out_dir), num_conversations=failed.num_conversations,
                                      train_steps=failed.train_steps, seed=failed.seed)
