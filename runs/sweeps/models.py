"""A sweep: one launch of several runs that differ in the settings it varies, and which of its runs
the queue has been given (a sweep hands its runs over a few at a time; see runs.sweeps.release).

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse


class Sweep(models.Model):
    class Mode(models.TextChoices):
        GRID = "grid", "grid (every combination)"
        LIST = "list", "list (the i-th values together)"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sweeps")
    name = models.CharField(max_length=200)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.GRID)
    varied = models.JSONField(default=list, help_text='[[key, [value as typed, ...]], ...] in the order given')
    base = models.JSONField(default=dict, help_text="target, dataset and settings every run starts from")
    parallel = models.PositiveSmallIntegerField(default=1, help_text="runs of the sweep in the queues at once")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or f"sweep {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:sweep_detail", args=[self.pk])

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.varied]


class SweepRun(models.Model):
    """A run of a sweep: its place, the swept settings it got (as typed), and when the sweep handed it to
    the queue (null while it waits for an earlier run of its sweep to finish)."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="entries")
    run = models.OneToOneField("runs.PipelineRun", on_delete=models.CASCADE, related_name="sweep_entry")
    position = models.PositiveIntegerField()
    values = models.JSONField(default=dict, help_text="{key: value as typed} of the swept keys")
    released_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["sweep", "position"]
        constraints = [models.UniqueConstraint(fields=["sweep", "position"], name="unique_sweep_position")]
