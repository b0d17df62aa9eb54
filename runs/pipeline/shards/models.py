"""One shard of a stage split over many workers (issue 36): a contiguous span of the stage's rows, run by
whichever live worker takes its message, with what a stage row has (a claim naming its worker, a lease,
attempts, progress, a log). runs/models.py imports it so Django finds it; runs.pipeline.shards.services
writes it, workers.orchestration.shard_tasks runs it."""
from __future__ import annotations

from django.db import models

from runs.pipeline.lifecycle.stage_record import StageStatus


class StageShard(models.Model):
    """Rows [row_start, row_stop) of one stage row (`stage`, `record_id`), in the order one worker does them."""

    run = models.ForeignKey("runs.PipelineRun", on_delete=models.CASCADE, null=True, blank=True,
                            related_name="shards")
    stage = models.CharField(max_length=20)
    record_id = models.PositiveIntegerField(help_text="the stage row's id (Preparation, ExtractStage, ...)")
    index = models.PositiveIntegerField()
    row_start = models.PositiveIntegerField()
    row_stop = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=StageStatus.choices, default=StageStatus.QUEUED, db_index=True)
    # The worker that took its message (a claim, lapsing after CLAIM_SECONDS while queued), then runs it.
    worker = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0, help_text="times a worker started it")
    queued_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    rows_done = models.PositiveIntegerField(default=0)
    log_tail = models.TextField(blank=True)
    error = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="what the shard's stage function returned")
    # The planner's: spans begin on its forward batches' edges, and a shard runs them on any host as planned.
    batch_tokens = models.PositiveIntegerField(null=True, blank=True, help_text=(
        "padded tokens per forward this shard runs its rows in (the Transformers extraction's, fixed when the "
        "stage is split); empty for a stage that does not batch rows"))

    class Meta:
        ordering = ["stage", "record_id", "index"]
        constraints = [models.UniqueConstraint(fields=["stage", "record_id", "index"], name="unique_stage_shard")]
        indexes = [models.Index(fields=["stage", "record_id"], name="shard_stage_record")]

    def __str__(self) -> str:
        return f"shard {self.index} of {self.stage} {self.record_id}"

    @property
    def rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def span_label(self) -> str:
        """As people count them: "rows 64–127" (the last row included)."""
        return f"rows {self.row_start}–{self.row_stop - 1}"

    @property
    def seconds(self) -> float | None:
        if not self.started_at:
            return None
        from django.utils import timezone

        return ((self.finished_at or timezone.now()) - self.started_at).total_seconds()

    @property
    def rows_per_second(self) -> float | None:
        seconds = self.seconds
        return self.rows_done / seconds if seconds and self.rows_done else None
