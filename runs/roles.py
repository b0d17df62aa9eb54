"""Who may do what. Groups: viewer (reads), launcher (launches and cancels runs, imports),
reviewer (verifies and reviews), admin (everything). Superusers count as admin."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied

ROLES = ("viewer", "launcher", "reviewer", "admin")

# action -> the groups allowed to do it
ALLOWED = {
    "launch": {"launcher", "admin"},
    "cancel": {"launcher", "admin"},
    "import": {"launcher", "admin"},
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
