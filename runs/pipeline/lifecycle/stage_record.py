"""What every row a worker runs has in common (a run's stages and the jobs users start): status,
timing, progress, log, and the lease its worker renews. Abstract: each kind has its own table."""
from __future__ import annotations

from django.db import models, transaction

from runs.pipeline.status import changes
from workers.contract.failures import RETRYABLE_KINDS, failure_details, failure_from_text, failure_headline, log_shown


class StageStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED_STATUSES = (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED)


class StageQuerySet(models.QuerySet):
    """Stage and job rows whose `.update()` counts for the runs of the rows it wrote (runs.pipeline.status.changes),
    so that a live page sees every write, whoever made it."""

    def update(self, **kwargs):
        lookups = changes.run_lookups(self.model)
        if not lookups or set(kwargs) <= changes.UNSHOWN_FIELDS:
            return super().update(**kwargs)
        with transaction.atomic(using=self.db, savepoint=False):
            # The rows are locked as they are found, so exactly those are written and counted.
            rows = list(self.select_for_update(of=("self",)).values_list("pk", *lookups))
            if not rows:
                return 0
            written = models.QuerySet.update(self.model._base_manager.filter(pk__in=[row[0] for row in rows]), **kwargs)
            changes.runs_changed(run_ids=[value for row in rows for value in row[1:]],
                                 progress=set(kwargs) <= changes.PROGRESS_FIELDS)
        return written


# Each concrete model's stage or job name, filled by runs.pipeline.lifecycle.stages (which imports the models, so it
# cannot be imported from here): what a failure's sentence calls the row (workers.contract.failures).
NAMES_BY_MODEL: dict[type, str] = {}


class StageRecord(models.Model):
    """Status, timing, progress and log of one stage of one run."""

    status = models.CharField(max_length=16, choices=StageStatus.choices, default=StageStatus.QUEUED, db_index=True)
    queued_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    progress_done = models.BigIntegerField(default=0)
    progress_total = models.BigIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)  # a sentence naming what to change (workers.contract.failures); no traceback
    # Where it stopped, for developers: the frames without Python's banner (workers.contract.failures).
    error_trace = models.TextField(blank=True)
    # What a failure asks of the user (workers.contract.failures.KINDS): "transient" is retried; "settings" and
    # "inputs" need a copy with changes to `failure_field`, the launch form's field at fault ("" if none is).
    failure_kind = models.CharField(max_length=16, blank=True)
    failure_field = models.CharField(max_length=64, blank=True)
    log_tail = models.TextField(blank=True)
    out_dir = models.CharField(max_length=1000, blank=True)
    # Renewed by the running worker's heartbeat; a running stage whose lease lapsed has lost its worker.
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = StageQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
        changes.stage_row_saved(self)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def seconds(self) -> float | None:
        if not self.started_at:
            return None
        from django.utils import timezone

        end = self.finished_at or timezone.now()
        return (end - self.started_at).total_seconds()

    @property
    def progress_fraction(self) -> float:
        if self.status == StageStatus.SUCCEEDED:
            return 1.0
        if not self.progress_total:
            return 0.0
        return min(1.0, self.progress_done / self.progress_total)

    @property
    def stage_name(self) -> str:
        """"prepare", "serve_check"...: its kind's name (runs.pipeline.lifecycle.stages fills NAMES_BY_MODEL)."""
        return NAMES_BY_MODEL.get(type(self), "stage")

    @property
    def headline(self) -> str:
        """The error as every page shows it: a sentence, never a traceback (workers.contract.failures)."""
        return failure_headline(self.error, stage_name=self.stage_name)

    @property
    def log_shown(self) -> str:
        return log_shown(self.log_tail)

    @property
    def developer_details(self) -> str:
        return failure_details(self.error, self.error_trace)

    @property
    def retryable(self) -> bool:
        """Whether a retry of this failure can succeed; a row failed before failures were classified
        reads its stored text (workers.contract.failures)."""
        kind = self.failure_kind or failure_from_text(self.error, stage_name=self.stage_name).kind
        return kind in RETRYABLE_KINDS

