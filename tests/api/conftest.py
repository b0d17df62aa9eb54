"""Users of every role, a token for each, and a client that speaks to the API with one."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from runs.api import tokens


class ApiClient:
    """Django's test client with `Authorization: Bearer <token>` and JSON bodies."""

    def __init__(self, secret: str | None = None, header: str | None = None):
        self.client = Client()
        self.header = header if header is not None else (f"Bearer {secret}" if secret else None)

    def _extra(self) -> dict:
        return {"HTTP_AUTHORIZATION": self.header} if self.header is not None else {}

    def get(self, url: str, params: dict | None = None):
        return self.client.get(url, params or {}, **self._extra())

    def post(self, url: str, body=None):
        data = json.dumps(body if body is not None else {})
        return self.client.post(url, data, content_type="application/json", **self._extra())

    def call(self, method: str, url: str, body=None):
        return self.client.generic(method, url, json.dumps(body) if body is not None else "",
                                   content_type="application/json", **self._extra())


def make_user(username: str, *groups: str, superuser: bool = False):
    users = get_user_model()
    user = (users.objects.create_superuser(username, password=None) if superuser
            else users.objects.create_user(username))
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


@pytest.fixture
def people(db):
    """A user per role (admin is a superuser), a second launcher, and a token for each:
    people["launcher"] is (user, secret)."""
    made = {
        "viewer": make_user("api-viewer", "viewer"),
        "launcher": make_user("api-launcher", "launcher"),
        "other_launcher": make_user("api-launcher-2", "launcher"),
        "reviewer": make_user("api-reviewer", "reviewer"),
        "admin": make_user("api-admin", "admin", superuser=True),
    }
    return {role: (user, tokens.token_create(user=user, name=f"{role} tests")[1]) for role, user in made.items()}


@pytest.fixture
def api(people):
    """api("launcher") is a client sending that role's token."""
    return lambda role: ApiClient(people[role][1])


@pytest.fixture(autouse=True)
def auth_failures_cleared():
    """Failed attempts are counted per address for a minute, in Redis: one test's are not the next's."""
    tokens.auth_failures_clear(client="127.0.0.1")
    yield
    tokens.auth_failures_clear(client="127.0.0.1")
