"""Training curves: a series per (training run, split, key), its points in chunks.

Kept apart from runs/models.py, which imports these so Django finds them."""
from __future__ import annotations

from django.db import models


class MetricSeries(models.Model):
    """One curve of a training run. Its summary (count, last, min and max with their steps) is kept
    up to date as points arrive, so lists and comparisons never read the points."""

    training_run = models.ForeignKey("runs.TrainingRun", on_delete=models.CASCADE, related_name="metric_series")
    split = models.CharField(max_length=10)
    key = models.CharField(max_length=50)
    num_points = models.BigIntegerField(default=0)
    first_step = models.BigIntegerField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    last_value = models.FloatField(null=True, blank=True)
    last_epoch = models.FloatField(null=True, blank=True)
    min_value = models.FloatField(null=True, blank=True)
    min_step = models.BigIntegerField(null=True, blank=True)
    max_value = models.FloatField(null=True, blank=True)
    max_step = models.BigIntegerField(null=True, blank=True)
    num_non_finite = models.BigIntegerField(default=0, help_text="NaN or infinite values: kept, not drawn")
    num_refused = models.BigIntegerField(default=0, help_text="points refused: their step was not after the last one")
    # The chunks not yet full: always the series' last ones (runs.tracking.services._batch_write).
    open_points = models.PositiveIntegerField(default=0)
    open_chunks = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name_plural = "metric series"
        ordering = ["training_run", "key", "split"]
        constraints = [models.UniqueConstraint(fields=["training_run", "split", "key"], name="unique_metric_series")]

    def __str__(self) -> str:
        return f"{self.split} {self.key} of training {self.training_run_id}"


class MetricChunk(models.Model):
    """Up to runs.tracking.chunks.CHUNK_POINTS consecutive points of a series, one array per column,
    and a preview (the min and max of each slice) that whole-curve charts read instead."""

    series = models.ForeignKey(MetricSeries, on_delete=models.CASCADE, related_name="chunks")
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    num_points = models.PositiveIntegerField()
    steps = models.BinaryField()
    epochs = models.BinaryField()
    values = models.BinaryField()
    times = models.BinaryField()
    preview = models.BinaryField()

    class Meta:
        ordering = ["series", "first_step"]
        indexes = [models.Index(fields=["series", "last_step"], name="metric_chunk_series_last")]
