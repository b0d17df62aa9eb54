"""Who sees and who launches into which project: the project roles, beside the site's (runs.roles).

A member's role is theirs in that project (viewer < editor < owner). In a project open to all (the one
earlier runs were put in) every signed-in user is a viewer, and those the site lets launch (the launcher
or admin role) editors. Staff see every project's runs; superusers own every project. A run of a project
one does not see is answered 404, as if it did not exist, on its page and in the API.

The one rule for everything a URL, a form or a service names (a run, checkpoint, extraction, sweep, dataset,
regeneration, a worker's current job, an alert's baseline) is KINDS (what each belongs to), `visible` and
`visible_or_404` (the same "no <kind> <id>" whether it does not exist or is in a project one does not see),
and `rule` (role × object × action), the table tests/views/projects/test_project_wall.py walks every route with."""
from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db.models import Model, OuterRef, Q, QuerySet, Subquery
from django.http import Http404

from runs.projects.models import Project, ProjectMember, default_project_pk
from runs.roles import ALLOWED, user_can, user_roles

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
    rows = list(projects_seen_by_member(user).order_by("name").values_list("pk", "name"))
    return sorted(pk for pk, _ in rows), [name for _, name in rows]


def projects_seen_by_member(user: AbstractBaseUser | int) -> QuerySet[Project]:
    """The projects a signed-in user who is not staff sees (visible_projects): the open ones and those they
    are a member of, whatever the role. `user`: the user or their id."""
    member_of = ProjectMember.objects.filter(user=user).values("project_id")
    return Project.objects.filter(Q(open_to_all=True) | Q(pk__in=member_of))


def visible_project_ids(user: AbstractBaseUser) -> list[int] | None:
    """Ids of the projects whose runs the user sees, sorted; None: every project (staff)."""
    return visible_projects(user)[0]


def runs_visible(runs: QuerySet, user: AbstractBaseUser) -> QuerySet:
    """`runs` narrowed to the projects the user sees, in the same query (no round trip of its own)."""
    return visible("run", runs, user)


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
    return visible("checkpoint", checkpoints, user)


def has_role(user: AbstractBaseUser, project: Project, role: str) -> bool:
    return RANK.get(project_roles(user).get(project.pk), 0) >= RANK[role]


def require_role(user: AbstractBaseUser, project: Project, role: str, action: str) -> None:
    """PermissionDenied naming the role to ask a project owner for."""
    if not has_role(user, project, role):
        raise PermissionDenied(f"{user.get_username() or 'anonymous'} may not {action} in project {project.name}: "
                               f"ask one of its owners for the {role} role")


def default_project_for(user: AbstractBaseUser) -> Project:
    """Where a launch that names no project goes: always the open Default project, whatever projects the
    user creates or joins, so that no new project silently takes over their unnamed launches (the launch form
    preselects it, and any other project is the user's explicit choice). A user who may not launch there is
    refused at `project` (runs.projects.services.launch_project), not sent elsewhere."""
    return Project.objects.get(pk=default_project_pk())


def launchable_projects(user: AbstractBaseUser) -> list[Project]:
    """The projects the user may launch into (editor or owner there, by membership or as the open project's
    launcher), by name: the launch form's choices."""
    roles = project_roles(user)
    allowed = [pk for pk, role in roles.items() if RANK[role] >= RANK[ProjectMember.Role.EDITOR]]
    return list(Project.objects.filter(pk__in=allowed).order_by("name"))


@dataclass(frozen=True)
class Kind:
    """What an object a URL can name belongs to. `run`: the lookup from it to the run whose project decides
    who sees it (None: no project's, everyone signed in sees it); `own`: when that lookup's first step is
    empty (an imported checkpoint or extraction), it belongs to no run, hence to everyone signed in."""
    noun: str  # the 404's word: "no <noun> <id>"
    model: str
    run: str | None
    own: str = ""
    many: bool = False  # reaches several runs (a sweep): seen when one of them is


KINDS = {
    "run": Kind("run", "runs.PipelineRun", run=""),
    "checkpoint": Kind("checkpoint", "runs.Checkpoint", run="training_run__run__", own="training_run"),
    "extraction": Kind("extraction", "runs.Extraction", run="produced_by__run__", own="produced_by"),
    "sweep": Kind("sweep", "runs.Sweep", run="entries__run__", many=True),
    # A dataset is a file anyone may train on, and a regeneration makes one: no project's. What of a run
    # they show (a preparation, a run's name) goes through the run's rule.
    "dataset": Kind("dataset", "runs.Dataset", run=None),
    "regeneration": Kind("regeneration", "runs.DatasetRegeneration", run=None),
}


def visible(kind: str, rows: QuerySet, user: AbstractBaseUser) -> QuerySet:
    """`rows` (of KINDS[kind]'s model) narrowed to those the user sees, in the same query."""
    spec = KINDS[kind]
    if not user.is_authenticated:
        return rows.none()
    if spec.run is None or sees_every_project(user):
        return rows
    seen = visible_q(user, run=spec.run)
    if spec.own:
        seen = Q(**{f"{spec.own}__isnull": True}) | seen
    if spec.many:  # a join through several runs: the rows themselves, once each
        return rows.filter(pk__in=rows.model.objects.filter(seen).values("pk"))
    return rows.filter(seen)


def visible_or_404(kind: str, pk, user: AbstractBaseUser, rows: QuerySet | None = None) -> Model:
    """The object (from `rows`, else its model's), or Http404 with the same words whether it does not exist
    or is where the user does not see: "no run 7" tells nobody which ids exist."""
    spec = KINDS[kind]
    rows = rows if rows is not None else apps.get_model(spec.model).objects.all()
    found = visible(kind, rows.filter(pk=pk), user).first() if isinstance(pk, int) and 0 < pk < 2**63 else None
    if found is None:
        raise Http404(f"no {spec.noun} {pk}")
    return found


def visible_check(kind: str, pk, user: AbstractBaseUser) -> None:
    """visible_or_404 reading the id alone, for a caller that needs only the answer (one small query)."""
    visible_or_404(kind, pk, user, rows=apps.get_model(KINDS[kind].model).objects.only("pk"))


def visible_ids(kind: str, ids, user: AbstractBaseUser) -> set[int]:
    """Which of these ids of KINDS[kind] the user sees (one query): for lists that name what they refer to."""
    ids = {pk for pk in ids if pk is not None}
    if not ids:
        return set()
    rows = apps.get_model(KINDS[kind].model).objects.filter(pk__in=ids)
    return set(visible(kind, rows, user).values_list("pk", flat=True))


# Role × object × action. Each action names the site action it needs (runs.roles.ALLOWED; None: anyone
# signed in) and whether only the object's owner (or an admin) may take it. `rule` reads this for a role.
ACTIONS = {
    ("run", "read"): (None, False), ("run", "act"): ("cancel", True), ("run", "copy"): ("launch", False),
    ("run", "review"): (None, False),  # a comment is anyone's; approving needs the review role
    ("checkpoint", "read"): (None, False), ("checkpoint", "evaluate"): ("launch", False),
    ("checkpoint", "review"): (None, False), ("checkpoint", "export"): ("launch", False),
    ("extraction", "read"): (None, False), ("extraction", "verify"): ("verify", False),
    ("extraction", "override"): ("review", False), ("extraction", "review"): (None, False),
    ("sweep", "read"): (None, False), ("sweep", "act"): ("cancel", True),
    ("dataset", "read"): (None, False), ("dataset", "catalogue"): ("launch", False),
    ("dataset", "regenerate"): ("launch", False),
    ("regeneration", "act"): ("cancel", True),
    # Named in lists: a worker's current job and queued work, an alert rule's baseline run.
    ("run", "name"): (None, False), ("run", "baseline"): (None, False),
}
# The answers: every project's (staff); whoever sees it; whoever sees it and owns it (or an admin); refused
# for want of the site role (403, naming it), which says nothing more of the object than a 404 does.
EVERY_PROJECT, SEES, OWNER, NO_ROLE = "every project", "sees", "owner", "no role"
TABLE_ROLES = ("viewer", "launcher", "reviewer", "admin", "staff")


def rule(role: str, kind: str, action: str) -> str:
    """What `role` (a site role, or "staff") may do to an object of `kind`: EVERY_PROJECT, SEES, OWNER or
    NO_ROLE. Staff are superusers here, as the admin site makes them."""
    needed, owner_only = ACTIONS[(kind, action)]
    if role == "staff":
        return EVERY_PROJECT
    if needed is not None and role not in ALLOWED[needed]:
        return NO_ROLE
    return OWNER if owner_only and role != "admin" else SEES


def user_rule(user: AbstractBaseUser, kind: str, action: str) -> str:
    """`rule` for this user: their best answer over their site roles."""
    if sees_every_project(user):
        return EVERY_PROJECT
    order = (NO_ROLE, OWNER, SEES)
    return max((rule(role, kind, action) for role in user_roles(user)), key=order.index, default=NO_ROLE)
