"""Writes for the jobs users start outside a run (runs.job_models): asking for one (what a worker
records when one is done is in runs.stage_services, beside the stages' recorders). Asking twice while one is still queued or running returns that
one: a double click or two reviewers never start the same work twice."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.job_models import DatasetCatalogue, VerificationRequest
from runs.models import FINISHED_STATUSES, Dataset, Extraction
from runs.queue import job_enqueue
from runs.roles import require


@transaction.atomic
def dataset_catalogue_request(*, dataset: Dataset, user: AbstractBaseUser | None = None) -> DatasetCatalogue:
    """Queue a pass over the dataset's file that adds its new conversations to the catalogue."""
    if user is not None:
        require(user, "launch")
    Dataset.objects.select_for_update().filter(pk=dataset.pk).first()  # one request at a time per dataset
    pending = dataset.catalogues.exclude(status__in=FINISHED_STATUSES).first()
    if pending is not None:
        return pending
    catalogue = DatasetCatalogue.objects.create(dataset=dataset, requested_by=user, size_bytes=dataset.size_bytes)
    job_enqueue(job_name="catalogue", record_id=catalogue.pk)
    return catalogue


@transaction.atomic
def extraction_verify_request(*, extraction: Extraction, full: bool, user: AbstractBaseUser | None = None
                              ) -> VerificationRequest:
    """Queue a check of the extraction's files (headers; every value too when `full`)."""
    if user is not None:
        require(user, "verify")
    Extraction.objects.select_for_update().filter(pk=extraction.pk).first()
    pending = extraction.verification_requests.exclude(status__in=FINISHED_STATUSES).filter(full=full).first()
    if pending is not None:
        return pending
    request = VerificationRequest.objects.create(extraction=extraction, full=full, requested_by=user)
    job_enqueue(job_name="verify", record_id=request.pk)
    return request
