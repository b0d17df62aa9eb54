"""Reads of projects for pages and the API."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q

from runs.projects import access
from runs.projects.models import Project


def project_list(*, user: AbstractBaseUser) -> list[dict]:
    """The projects the user sees, each with their role (None for staff who are not members) and its run
    count (archived runs left out); two queries whatever the number of projects."""
    roles = access.project_roles(user)
    projects = Project.objects.annotate(run_count=Count("runs", filter=Q(runs__archived=False))).order_by("name")
    if not access.sees_every_project(user):
        projects = projects.filter(pk__in=list(roles))
    return [{"id": p.pk, "name": p.name, "open_to_all": p.open_to_all, "role": roles.get(p.pk),
             "runs": p.run_count} for p in projects]
