"""A saved view of the runs list. runs/models.py imports it so Django finds it."""
from __future__ import annotations

from django.conf import settings
from django.db import models

MAX_VIEW_NAME_CHARS = 100


class SavedView(models.Model):
    """`params`: the runs list's query parameters ({name: value}, as runs.tracking.runs_list.run_filters.RunFilters
    reads them: filters, `columns`, `sort`), checked when saved. Shared: every member of `project` sees
    it in their menu; otherwise only its owner does."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=MAX_VIEW_NAME_CHARS)
    params = models.JSONField(default=dict)
    project = models.ForeignKey("runs.Project", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="saved_views")
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_saved_view_name"),
            models.CheckConstraint(condition=models.Q(shared=False) | models.Q(project__isnull=False),
                                   name="shared_view_has_project"),
        ]

    def __str__(self) -> str:
        return self.name
