"""Reads of projects for pages and the API."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q
from django.http import Http404

from runs.projects import access
from runs.projects.models import Project, ProjectMember


def project_list(*, user: AbstractBaseUser) -> list[dict]:
    """The projects the user sees, each with their role (None for staff who are not members) and its run
    count (archived runs left out); two queries whatever the number of projects."""
    roles = access.project_roles(user)
    projects = Project.objects.annotate(run_count=Count("runs", filter=Q(runs__archived=False))).order_by("name")
    if not access.sees_every_project(user):
        projects = projects.filter(pk__in=list(roles))
    return [{"id": p.pk, "name": p.name, "open_to_all": p.open_to_all, "role": roles.get(p.pk),
             "runs": p.run_count} for p in projects]


def checkpoint_visible_check(*, pk: int, user: AbstractBaseUser) -> None:
    """Http404 unless the checkpoint exists and was imported or trained by a run the user sees (one query):
    a checkpoint of a hidden run is answered as one that does not exist (access.visible_or_404)."""
    access.visible_check("checkpoint", pk, user)


def sweep_visible_check(*, pk: int, user: AbstractBaseUser) -> None:
    """Http404 when the user sees none of the sweep's runs (one query). A sweep's runs are launched into
    one project, but staff may move a run to another in the admin: the sweep then shows each viewer the
    runs they see and says how many it leaves out (runs.sweeps.selectors.sweep_rows). Staff open even a
    sweep whose runs were all deleted."""
    access.visible_check("sweep", pk, user)


def project_get(*, pk: int, user: AbstractBaseUser) -> Project:
    """One project the user sees (a member of it, an open one, or staff); Http404 otherwise."""
    project = Project.objects.filter(pk=pk).first()
    if project is None or not (access.sees_every_project(user) or pk in access.project_roles(user)):
        raise Http404(f"no project {pk}")
    return project


def project_members(*, project: Project) -> list[dict]:
    """The project's members, by username, with their roles (one query)."""
    rows = (ProjectMember.objects.filter(project=project).select_related("user").order_by("user__username"))
    return [{"username": m.user.get_username(), "role": m.role} for m in rows]


def launch_project_choices(*, user: AbstractBaseUser) -> dict:
    """The launch form's project select: the names of the projects the user may launch into, and the one it
    preselects, where a launch naming no project goes (access.default_project_for: Default)."""
    return {"projects": [p.name for p in access.launchable_projects(user)],
            "default_project": access.default_project_for(user).name}
