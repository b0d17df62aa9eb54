"""People's notes on runs: reviews (comments, approvals, change requests on a run, an extraction or a
checkpoint) and tags they put on runs to find them again ("baseline", "kimi-fp8", "paper"); the runs
list filters by them.

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models

MAX_TAG_CHARS = 40


class RunTag(models.Model):
    name = models.CharField(max_length=MAX_TAG_CHARS, unique=True)
    runs = models.ManyToManyField("runs.PipelineRun", related_name="tags", blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Review(models.Model):
    """A comment, approval or change request on a run, an extraction or a checkpoint."""

    class Decision(models.TextChoices):
        COMMENT = "comment"
        APPROVE = "approve"
        REQUEST_CHANGES = "request_changes", "request changes"

    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reviews")
    decision = models.CharField(max_length=20, choices=Decision.choices, default=Decision.COMMENT)
    text = models.TextField()
    run = models.ForeignKey("runs.PipelineRun", on_delete=models.CASCADE, null=True, blank=True, related_name="reviews")
    extraction = models.ForeignKey("runs.Extraction", on_delete=models.CASCADE, null=True, blank=True, related_name="reviews")
    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.CASCADE, null=True, blank=True, related_name="reviews")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(run__isnull=False, extraction__isnull=True, checkpoint__isnull=True)
                    | models.Q(run__isnull=True, extraction__isnull=False, checkpoint__isnull=True)
                    | models.Q(run__isnull=True, extraction__isnull=True, checkpoint__isnull=False)
                ),
                name="review_has_exactly_one_subject",
            )
        ]

