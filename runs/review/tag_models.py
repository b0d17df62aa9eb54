"""Tags people put on runs to find them again ("baseline", "kimi-fp8", "paper"); the runs list filters by them.

Kept apart from runs/models.py, which imports this so Django finds it."""
from __future__ import annotations

from django.db import models

MAX_TAG_CHARS = 40


class RunTag(models.Model):
    name = models.CharField(max_length=MAX_TAG_CHARS, unique=True)
    runs = models.ManyToManyField("runs.PipelineRun", related_name="tags", blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
