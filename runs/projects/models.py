"""A project groups runs; its members' roles say who sees its runs and who launches into it.

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models

DEFAULT_PROJECT_NAME = "Default"
MAX_PROJECT_NAME_CHARS = 100


class Project(models.Model):
    """`open_to_all`: every signed-in user is a member by their site roles (runs.projects.access): the
    project the migration put every earlier run in is open, so that nobody lost sight of a run."""

    name = models.CharField(max_length=MAX_PROJECT_NAME_CHARS, unique=True)
    open_to_all = models.BooleanField(default=False, help_text=(
        "every signed-in user sees its runs; those with the launcher role launch into it"))
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="projects_created")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ProjectMember(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer"
        EDITOR = "editor"
        OWNER = "owner"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        ordering = ["project", "user"]
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="unique_project_member")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


def default_project_pk() -> int:
    """PipelineRun.project's default: the open project earlier runs were put in, made again when a
    database was emptied (tests flush it), so a run created without a project still has one."""
    project, _ = Project.objects.get_or_create(name=DEFAULT_PROJECT_NAME, defaults={"open_to_all": True})
    return project.pk
