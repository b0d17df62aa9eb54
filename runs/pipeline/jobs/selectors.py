"""Reads for the jobs users start outside a run (runs.pipeline.jobs.models): what a dataset's or an
extraction's page shows of its latest jobs, including one the broker has not taken yet."""
from __future__ import annotations

from dataclasses import dataclass

from runs.pipeline.jobs.models import DatasetCatalogue, VerificationRequest
from runs.data.models import Dataset, Extraction
from runs.pipeline.models import PendingEnqueue
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES, StageRecord


@dataclass(frozen=True)
class JobShown:
    job: StageRecord
    waiting_for_broker: str  # the broker's last refusal while the job sits in the outbox, else ""

    @property
    def active(self) -> bool:
        return self.job.status not in FINISHED_STATUSES


def _shown(jobs: list[StageRecord], kind: str) -> list[JobShown]:
    refused = dict(PendingEnqueue.objects.filter(kind=kind, object_id__in=[j.pk for j in jobs], attempts__gt=0)
                   .values_list("object_id", "last_error"))
    return [JobShown(job=j, waiting_for_broker=refused.get(j.pk, "")) for j in jobs]


def dataset_catalogues(*, dataset: Dataset, limit: int = 5) -> list[JobShown]:
    """The dataset's latest catalogue passes, newest first."""
    jobs = list(DatasetCatalogue.objects.filter(dataset=dataset).select_related("requested_by")[:limit])
    return _shown(jobs, "catalogue")


def extraction_verification_requests(*, extraction: Extraction, limit: int = 5) -> list[JobShown]:
    """The extraction's latest verification requests, newest first, with the verification each made."""
    jobs = list(VerificationRequest.objects.filter(extraction=extraction)
                .select_related("requested_by", "verification")[:limit])
    return _shown(jobs, "verify")


def dataset_sample_counts(*, dataset: Dataset) -> tuple[int, int]:
    """(conversations catalogued, excluded)."""
    samples = dataset.samples.all()
    return samples.count(), samples.filter(excluded=True).count()
