"""Who may do what. Groups: viewer (reads), launcher (launches runs, cancels, retries and tags their
own, imports), reviewer (verifies and reviews), admin (everything). Superusers count as admin.
Other groups are teams (require_on_run). Beside these site roles, each project has its own (viewer,
editor, owner: runs.projects.access): seeing a run needs its project, launching the site's launch role
and the project's editor role."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied

ROLES = ("viewer", "launcher", "reviewer", "admin")

# action -> the groups allowed to do it
ALLOWED = {
    "launch": {"launcher", "admin"},
    "cancel": {"launcher", "admin"},
    "retry": {"launcher", "admin"},
    "tag": {"launcher", "admin"},
    "import": {"launcher", "admin"},
    # A run trained elsewhere: its client reports curves, checkpoints and its end (runs.pipeline.launch.external).
    "report": {"launcher", "admin"},
    "verify": {"reviewer", "launcher", "admin"},
    "review": {"reviewer", "admin"},
}


def user_roles(user: AbstractBaseUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    if user.is_superuser:
        return set(ROLES)
    return set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))


def user_can(user: AbstractBaseUser, action: str) -> bool:
    return bool(user_roles(user) & ALLOWED[action])


def require(user: AbstractBaseUser, action: str) -> None:
    if not user_can(user, action):
        allowed = " or ".join(sorted(ALLOWED[action]))
        raise PermissionDenied(f"{user.get_username() or 'anonymous'} may not {action}: ask an admin for the {allowed} role")


# Acting on a run that exists (cancel, retry, tags): its owner and admins may; another user with the
# role may too when they share a team with the owner (a group that is not a role) and the owner let
# their teams act on their runs (runs.api.models.AccountSettings, off by default). Pages, the API and
# commands all reach the services, which call this.
def user_teams(user: AbstractBaseUser) -> set[int]:
    """Ids of the user's teams: their groups other than the roles."""
    if not user.is_authenticated:
        return set()
    return set(user.groups.exclude(name__in=ROLES).values_list("pk", flat=True))


def may_act_on_run(user: AbstractBaseUser, run) -> bool:
    if not user.is_authenticated:
        return False
    if run.owner_id == user.pk or "admin" in user_roles(user):
        return True
    # The owner's AccountSettings, through the user's own relation to it: roles stand below the API.
    if not get_user_model().objects.filter(pk=run.owner_id, account_settings__team_may_act=True).exists():
        return False
    return bool(user_teams(user) & user_teams(run.owner))


def require_on_run(user: AbstractBaseUser, run, action: str) -> None:
    """`action` on `run`: the role for it (require), then the run's owner, an admin, or a teammate the
    owner allowed; PermissionDenied saying who may otherwise."""
    require(user, action)
    if not may_act_on_run(user, run):
        owner = run.owner.get_username()
        raise PermissionDenied(
            f"{user.get_username()} may not {action} run {run.pk}: it is {owner}'s, and only its owner and admins "
            f"may; {owner} can let their team act on their runs on their account page (/account/)")
