"""Long work a user asks for outside a pipeline run: cataloguing a dataset's conversations and
verifying an extraction's files. Either can take minutes on a large dataset or extraction, so it
runs on a cpu worker, not inside the request, as a stage-like row: status, progress, a lease
renewed by the worker, attempts (runs.pipeline.JOBS registers them beside the stages).

Kept apart from runs/models.py, which imports this so Django finds it."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.stage_record import StageRecord


class DatasetCatalogue(StageRecord):
    """One pass over a dataset file that adds the conversations not yet catalogued (for curation)."""

    dataset = models.ForeignKey("runs.Dataset", on_delete=models.CASCADE, related_name="catalogues")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    size_bytes = models.BigIntegerField(default=0, help_text="the file's size when the pass was asked for")
    samples_added = models.PositiveIntegerField(null=True, blank=True)
    samples_total = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"catalogue of {self.dataset_id}"


class VerificationRequest(StageRecord):
    """A user's request to check an extraction's files (headers, or every value when `full`); the
    Verification it produced is linked once done."""

    extraction = models.ForeignKey("runs.Extraction", on_delete=models.CASCADE, related_name="verification_requests")
    full = models.BooleanField(default=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    verification = models.OneToOneField("runs.Verification", on_delete=models.SET_NULL, null=True, blank=True,
                                        related_name="request")

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"verification of {self.extraction_id}"
