"""Reports: a page of notes in Markdown with live blocks (charts, tables, generations of chosen runs),
kept as versions. Every save is a new version (ReportVersion); the report row holds what the list shows
of its newest one, so the list reads no versions.

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

MAX_TITLE_CHARS = 200
MAX_BODY_CHARS = 100_000


class Report(models.Model):
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reports")
    title = models.CharField(max_length=MAX_TITLE_CHARS, help_text="the newest version's title")
    version_count = models.PositiveIntegerField(default=0, help_text="the newest version's number")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]

    def __str__(self) -> str:
        return self.title or f"report {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:report_detail", args=[self.pk])


class ReportVersion(models.Model):
    """One save of a report, as it was written; never changed afterwards."""

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(help_text="1 for the first save, then one more per save")
    title = models.CharField(max_length=MAX_TITLE_CHARS)
    body = models.TextField(blank=True, help_text="Markdown with {{chart ...}}, {{table ...}}, {{generations ...}} lines")
    # Staff may save another author's report: who wrote this version is kept apart from the report's author.
    saved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="report_versions")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["report", "-number"]
        constraints = [models.UniqueConstraint(fields=["report", "number"], name="unique_report_version")]

    def __str__(self) -> str:
        return f"{self.title} (version {self.number})"

    def get_absolute_url(self) -> str:
        return reverse("runs:report_version", args=[self.report_id, self.number])
