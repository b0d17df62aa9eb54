"""Sign-in throttling (django-axes, eagle3web/login_throttle.py) on the login page and the admin's, through
real requests: wrong passwords for one name from one address lock that name there (429, the page saying
why), the right password refused too until the cool-off; the same answers for a name nobody has; an address
spraying names is locked whatever the name; another address is not affected."""
from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db

PER_NAME = settings.AXES_FAILURE_LIMIT
PER_ADDRESS = settings.EAGLE3WEB_LOGIN_FAILURES_PER_ADDRESS
LOCKED = "Too many failed sign-ins from this address or with this user name"


def sign_in(client: Client, username: str, password: str, *, url: str = "/login/"):
    return client.post(url, {"username": username, "password": password})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_superuser("boss", password="pw-boss-1")


def test_30_wrong_passwords_lock_the_name_and_then_the_right_one_is_refused_too(user):
    client = Client()
    statuses = [sign_in(client, user.username, "wrong").status_code for _ in range(30)]
    assert statuses == [200] * (PER_NAME - 1) + [429] * (30 - PER_NAME + 1)
    answer = sign_in(client, user.username, user.raw_password)
    assert answer.status_code == 429 and LOCKED in answer.content.decode()
    assert "15 minutes" in answer.content.decode()
    assert not signed_in(client)


def test_an_unknown_name_gets_the_same_answers_as_a_known_one(user):
    def answers(username: str) -> list[tuple[int, str]]:
        client = Client()
        pages = [sign_in(client, username, "wrong") for _ in range(PER_NAME + 1)]
        return [(p.status_code, LOCKED in p.content.decode()) for p in pages]

    assert answers(user.username) == answers("nobody-by-this-name")


def test_the_admin_login_locks_and_refuses_the_right_password(staff):
    client = Client()
    statuses = [sign_in(client, "boss", "wrong", url="/admin/login/").status_code for _ in range(PER_NAME)]
    assert statuses == [200] * (PER_NAME - 1) + [429]
    answer = sign_in(client, "boss", "pw-boss-1", url="/admin/login/")
    assert answer.status_code == 429 and LOCKED in answer.content.decode()
    assert not signed_in(client)


def test_an_address_spraying_names_is_locked_for_every_name(user):
    client = Client()
    statuses = [sign_in(client, f"guess-{i}", "wrong").status_code for i in range(PER_ADDRESS)]
    assert statuses == [200] * (PER_ADDRESS - 1) + [429]
    assert sign_in(client, user.username, user.raw_password).status_code == 429
    assert not signed_in(client)


def test_another_address_still_signs_in(user):
    for _ in range(PER_NAME):
        sign_in(Client(), user.username, "wrong")
    elsewhere = Client(REMOTE_ADDR="10.0.0.2")
    assert sign_in(elsewhere, user.username, user.raw_password).status_code == 302
    assert signed_in(elsewhere)


def test_the_right_password_before_the_limit_clears_that_names_failures(user):
    client = Client()
    for _ in range(PER_NAME - 1):
        assert sign_in(client, user.username, "wrong").status_code == 200
    assert sign_in(client, user.username, user.raw_password).status_code == 302
    client.logout()
    assert [sign_in(client, user.username, "wrong").status_code for _ in range(PER_NAME - 1)] == [200] * (PER_NAME - 1)
