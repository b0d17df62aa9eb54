"""The authorization matrix's words (tests/views/url_map/test_authorization_matrix.py): the roles, what a
request can come to, and an entry per URL pattern."""
from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("anonymous", "viewer", "launcher", "reviewer", "admin")

# Outcomes
OK = "200"
REDIRECT = "redirect"  # 302 somewhere other than a login page: the write happened (or was refused with a message)
LOGIN = "login"  # 302 to /login/?next=
ADMIN_LOGIN = "admin login"  # 302 to /admin/login/?next=
ANY_LOGIN = "a login page"  # either: the admin sends anonymous users to its own login, some pages to the site's
ADMIN_OK = "staff page"  # 200, or a 302 within the admin that is not its login page
FORBIDDEN = "403"  # with the reason, naming the role to ask for
NOT_ALLOWED = "405"
NOT_FOUND = "404"
NOT_TRIED = "not tried"  # a staff member's admin POST is Django's own business
UNAUTHORIZED = "401"  # the API without a token


def by_role(anonymous: str, viewer: str, launcher: str, reviewer: str, admin: str) -> dict[str, str]:
    return dict(zip(ROLES, (anonymous, viewer, launcher, reviewer, admin)))


READ = by_role(LOGIN, OK, OK, OK, OK)
POST_ONLY = by_role(LOGIN, NOT_ALLOWED, NOT_ALLOWED, NOT_ALLOWED, NOT_ALLOWED)
LAUNCHERS = by_role(LOGIN, FORBIDDEN, REDIRECT, FORBIDDEN, REDIRECT)
LAUNCHERS_PAGE = by_role(LOGIN, FORBIDDEN, OK, FORBIDDEN, OK)
VERIFIERS = by_role(LOGIN, FORBIDDEN, REDIRECT, REDIRECT, REDIRECT)
REVIEWERS = by_role(LOGIN, FORBIDDEN, FORBIDDEN, REDIRECT, REDIRECT)
OWNERS = by_role(LOGIN, FORBIDDEN, FORBIDDEN, FORBIDDEN, REDIRECT)  # the admin's runs: its owner and admins
STAFF = by_role(ANY_LOGIN, ADMIN_LOGIN, ADMIN_LOGIN, ADMIN_LOGIN, ADMIN_OK)
STAFF_WRITE = {**STAFF, "admin": NOT_TRIED}


@dataclass
class Entry:
    url: str  # a sample URL for the pattern; {run}, {extraction}, ... are the world's ids
    get: dict[str, str]
    post: dict[str, str] | None = None  # None: the URL changes nothing, a POST is not tried
    data: str = ""  # name of the World method giving the POST body
    extra: dict = field(default_factory=dict)
    api: bool = False  # asked with the role's token and a JSON body, as a script would

