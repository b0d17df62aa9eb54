"""Who sees and who launches into which project: the project roles, beside the site's (runs.roles).

A member's role is theirs in that project (viewer < editor < owner). In a project open to all (the one
earlier runs were put in) every signed-in user is a viewer, and those the site lets launch (the launcher
or admin role) editors. Staff see every project's runs; superusers own every project. A run of a project
one does not see is answered 404, as if it did not exist, on its page and in the API."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, QuerySet, Subquery

from runs.projects.models import Project, ProjectMember, default_project_pk
from runs.roles import user_can

RANK = {ProjectMember.Role.VIEWER: 1, ProjectMember.Role.EDITOR: 2, ProjectMember.Role.OWNER: 3}


def sees_every_project(user: AbstractBaseUser) -> bool:
    return bool(user.is_authenticated and (user.is_staff or user.is_superuser))


def project_roles(user: AbstractBaseUser) -> dict[int, str]:
    """{project id: the user's role} of every project they are a member of, open ones included (two
    queries). Empty for an anonymous user."""
    if not user.is_authenticated:
        return {}
    if user.is_superuser:
        return {pk: ProjectMember.Role.OWNER for pk in Project.objects.values_list("pk", flat=True)}
    mine = Subquery(ProjectMember.objects.filter(project=OuterRef("pk"), user=user).values("role")[:1])
    rows = list(Project.objects.annotate(my_role=mine).filter(Q(open_to_all=True) | Q(my_role__isnull=False))
                .values_list("pk", "open_to_all", "my_role"))
    open_role = None
    if any(is_open for _, is_open, _ in rows):
        open_role = ProjectMember.Role.EDITOR if user_can(user, "launch") else ProjectMember.Role.VIEWER
    roles = {}
    for pk, is_open, role in rows:
        roles[pk] = max((r for r in (role, open_role if is_open else None) if r), key=RANK.__getitem__)
    return roles


def visible_projects(user: AbstractBaseUser) -> tuple[list[int] | None, list[str]]:
    """Ids of the projects whose runs the user sees, sorted (None: every project, for staff), and their
    names, in one query: open projects and those they are a member of, whatever the role."""
    if sees_every_project(user):
        return None, list(Project.objects.order_by("name").values_list("name", flat=True))
    if not user.is_authenticated:
        return [], []
    member_of = ProjectMember.objects.filter(user=user).values("project_id")
    rows = list(Project.objects.filter(Q(open_to_all=True) | Q(pk__in=member_of)).order_by("name")
                .values_list("pk", "name"))
    return sorted(pk for pk, _ in rows), [name for _, name in rows]


def visible_project_ids(user: AbstractBaseUser) -> list[int] | None:
    """Ids of the projects whose runs the user sees, sorted; None: every project (staff)."""
    return visible_projects(user)[0]


def runs_visible(runs: QuerySet, user: AbstractBaseUser) -> QuerySet:
    """`runs` narrowed to the projects the user sees, in the same query (no round trip of its own)."""
    if sees_every_project(user):
        return runs
    if not user.is_authenticated:
        return runs.none()
    member_of = ProjectMember.objects.filter(user=user).values("project_id")
    return runs.filter(Q(project__open_to_all=True) | Q(project_id__in=member_of))


def visible_q(user: AbstractBaseUser, *, run: str = "") -> Q | None:
    """A filter on rows reaching a run through `run` (a lookup path such as "training_run__run__"): those in
    a project the user sees. None: no filter (staff); an anonymous user gets a filter that matches nothing."""
    if sees_every_project(user):
        return None
    if not user.is_authenticated:
        return Q(pk__in=[])
    member_of = ProjectMember.objects.filter(user=user).values("project_id")
    return Q(**{f"{run}project__open_to_all": True}) | Q(**{f"{run}project_id__in": member_of})


def who_sees(users: QuerySet, *, project_id: int) -> QuerySet:
    """`users` narrowed to those who see the project's runs (staff, its members, everyone when it is open),
    in the same query: whom an alert about one of its runs may reach."""
    if Project.objects.filter(pk=project_id, open_to_all=True).exists():
        return users
    return users.filter(Q(is_staff=True) | Q(is_superuser=True) | Q(project_memberships__project_id=project_id)).distinct()


def checkpoints_visible(checkpoints: QuerySet, user: AbstractBaseUser) -> QuerySet:
    """`checkpoints` less those trained by runs the user does not see, in the same query. An imported
    checkpoint belongs to no run, hence to no project: everyone signed in sees it."""
    visible = visible_q(user, run="training_run__run__")
    if visible is None:
        return checkpoints
    if not user.is_authenticated:
        return checkpoints.none()
    return checkpoints.filter(Q(training_run__isnull=True) | visible)


def has_role(user: AbstractBaseUser, project: Project, role: str) -> bool:
    return RANK.get(project_roles(user).get(project.pk), 0) >= RANK[role]


def require_role(user: AbstractBaseUser, project: Project, role: str, action: str) -> None:
    """PermissionDenied naming the role to ask a project owner for."""
    if not has_role(user, project, role):
        raise PermissionDenied(f"{user.get_username() or 'anonymous'} may not {action} in project {project.name}: "
                               f"ask one of its owners for the {role} role")


def default_project_for(user: AbstractBaseUser) -> Project:
    """Where a launch that names no project goes: the first project (by name) the user is an editor or owner
    of by membership, else the open Default project."""
    member = (ProjectMember.objects.filter(user=user, role__in=[ProjectMember.Role.EDITOR, ProjectMember.Role.OWNER])
              .select_related("project").order_by("project__name").first()) if user.is_authenticated else None
    return member.project if member else Project.objects.get(pk=default_project_pk())

