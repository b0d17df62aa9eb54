"""Writes to projects: creating one (its creator owns it), setting a member's role, choosing a launch's project."""
from __future__ import annotations

import unicodedata

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.projects import access
from runs.projects.models import DEFAULT_PROJECT_NAME, MAX_PROJECT_NAME_CHARS, Project, ProjectMember
from runs.roles import require
from workers.contract.errors import InputError


class ProjectError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_project_name(name: object, *, field: str = "name") -> str:
    if not isinstance(name, str) or not name.strip():
        raise ProjectError("a project needs a name", field=field)
    name = " ".join(name.split())
    if len(name) > MAX_PROJECT_NAME_CHARS:
        raise ProjectError(f"{field} is {len(name)} characters long; at most {MAX_PROJECT_NAME_CHARS}", field=field)
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name):
        raise ProjectError(f"{field} holds control or unassigned characters", field=field)
    return name


@transaction.atomic
def project_create(*, user: AbstractBaseUser, name: str) -> Project:
    """A new project, closed (members only), owned by its creator; those who may launch may create one."""
    require(user, "launch")
    name = check_project_name(name)
    if Project.objects.filter(name__iexact=name).exists():
        raise ProjectError(f"a project named {name!r} exists already", field="name")
    project = Project.objects.create(name=name, created_by=user)
    ProjectMember.objects.create(project=project, user=user, role=ProjectMember.Role.OWNER)
    return project


@transaction.atomic
def project_member_set(*, project: Project, user: AbstractBaseUser, username: str, role: str | None) -> bool:
    """Give `username` a role in the project (None: remove them); only its owners and staff may. Whether
    anything changed. Refused, naming the field, for an unknown user or role, and where the project would be
    left with no owner by membership (nobody but staff could then manage it)."""
    if not access.sees_every_project(user):
        access.require_role(user, project, ProjectMember.Role.OWNER, "change members")
    if role is not None and role not in ProjectMember.Role.values:
        raise ProjectError(f"role must be one of {', '.join(ProjectMember.Role.values)}, got {str(role)[:20]!r}",
                           field="role")
    member = get_user_model().objects.filter(username=str(username)).first() if username else None
    if member is None:
        raise ProjectError(f"username: no user {str(username)[:50]!r}", field="username")
    owners = ProjectMember.objects.select_for_update().filter(project=project, role=ProjectMember.Role.OWNER)
    if role != ProjectMember.Role.OWNER and list(owners.values_list("user_id", flat=True)) == [member.pk]:
        raise ProjectError(f"username: {member.get_username()} is the last owner of {project.name}; make another "
                           "member an owner first", field="username")
    if role is None:
        return ProjectMember.objects.filter(project=project, user=member).delete()[0] > 0
    ProjectMember.objects.update_or_create(project=project, user=member, defaults={"role": role})
    return True


@transaction.atomic
def project_rename(*, project: Project, user: AbstractBaseUser, name: str) -> Project:
    """Rename the project (its owners and staff only), the name checked as at creation. The Default project
    keeps its name: launches naming no project find it by that name."""
    if not access.sees_every_project(user):
        access.require_role(user, project, ProjectMember.Role.OWNER, "rename the project")
    name = check_project_name(name)
    if project.name == DEFAULT_PROJECT_NAME:
        raise ProjectError(f"name: {DEFAULT_PROJECT_NAME} keeps its name: launches naming no project go there",
                           field="name")
    if Project.objects.filter(name__iexact=name).exclude(pk=project.pk).exists():
        raise ProjectError(f"a project named {name!r} exists already", field="name")
    project.name = name
    project.save(update_fields=["name"])
    return project


def launch_project(*, user: AbstractBaseUser, name: str | None) -> Project:
    """The project a launch goes to: the one named (by name; refused, naming `project`, when unknown or not
    one the user may launch in), else the open Default project (access.default_project_for), never a project
    the user happened to create or join."""
    if not name:
        project = access.default_project_for(user)
    else:
        project = Project.objects.filter(name=str(name)[:MAX_PROJECT_NAME_CHARS + 1]).first()
        if project is None or (not access.sees_every_project(user) and project.pk not in access.project_roles(user)):
            raise ProjectError(f"project: there is no project {str(name)[:50]!r} you are a member of", field="project")
    if not access.has_role(user, project, ProjectMember.Role.EDITOR):
        raise ProjectError(f"project: you may not launch in {project.name}: ask one of its owners for the editor role",
                           field="project")
    return project
