"""Tokens: made on the account page or by create_api_token, stored as a hash, sent as a bearer header,
acting with their user's role; bad ones are a 401 in JSON, and an address that keeps sending bad ones
is refused (429) for the rest of the minute. Everything a token does is in the audit trail."""
from __future__ import annotations

import hashlib
import io
import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from runs.api import tokens
from runs.api.models import ApiAuditEntry, ApiToken
from tests.api.conftest import ApiClient

pytestmark = pytest.mark.django_db


def test_a_request_without_a_token_is_a_401_in_json_saying_how_to_authenticate():
    response = ApiClient().get("/api/v1/runs/")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert response["WWW-Authenticate"] == 'Bearer realm="eagle3web"'
    assert "Authorization: Bearer <token>" in response.json()["error"]
    assert response.json()["fields"] == {}


@pytest.mark.parametrize("header", ["Token abc", "Bearer", "Bearer a b", "Basic dXNlcjpwdw==", "Bearer e3w_ä"])
def test_a_malformed_authorization_header_is_a_401(header, people):
    response = ApiClient(header=header).get("/api/v1/runs/")
    assert response.status_code == 401
    assert response.json()["error"].startswith("malformed Authorization header")


def test_an_unknown_token_is_a_401(people):
    secret = people["launcher"][1]
    response = ApiClient(secret[:-1] + ("A" if secret[-1] != "A" else "B")).get("/api/v1/runs/")
    assert response.status_code == 401
    assert "not known" in response.json()["error"]


def test_a_revoked_token_is_a_401_saying_it_was_revoked(people, api):
    user, secret = people["launcher"]
    assert api("launcher").get("/api/v1/me/").status_code == 200
    tokens.token_revoke(user=user, token_id=ApiToken.objects.get(user=user).pk)
    response = api("launcher").get("/api/v1/me/")
    assert response.status_code == 401
    assert "was revoked at" in response.json()["error"]


def test_a_deactivated_users_token_is_a_401(people, api):
    user, _ = people["launcher"]
    user.is_active = False
    user.save()
    response = api("launcher").get("/api/v1/me/")
    assert response.status_code == 401
    assert "deactivated" in response.json()["error"]


def test_only_the_secrets_sha256_is_stored_and_the_prefix_identifies_it(people):
    user, secret = people["viewer"]
    row = ApiToken.objects.get(user=user)
    assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret.startswith("e3w_") and len(secret) == 4 + 43  # 32 random bytes in URL-safe base64
    assert row.prefix == secret[:12]
    stored = json.dumps(list(ApiToken.objects.filter(pk=row.pk).values().first().values()), default=str)
    assert secret not in stored


def test_a_token_acts_with_its_users_role(api, roots):
    me = api("viewer").get("/api/v1/me/").json()
    assert (me["username"], me["roles"]) == ("api-viewer", ["viewer"])
    assert api("viewer").get("/api/v1/runs/").status_code == 200
    refused = api("viewer").post("/api/v1/runs/", {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl")})
    assert refused.status_code == 403
    assert refused.json()["error"] == "api-viewer may not launch: ask an admin for the admin or launcher role"


def test_last_used_time_is_noted(people, api):
    user, _ = people["reviewer"]
    assert ApiToken.objects.get(user=user).last_used_at is None
    api("reviewer").get("/api/v1/me/")
    assert ApiToken.objects.get(user=user).last_used_at is not None


def _clear_of_the_minutes_end():
    # The limit counts per clock minute: a test run across its end would start counting again.
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


def test_an_address_sending_bad_tokens_is_refused_for_the_rest_of_the_minute(people, api, settings):
    settings.EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE = 3
    _clear_of_the_minutes_end()
    bad = ApiClient("e3w_" + "x" * 43)
    assert [bad.get("/api/v1/me/").status_code for _ in range(3)] == [401, 401, 401]
    refused = bad.get("/api/v1/me/")
    assert refused.status_code == 429
    assert "too many failed authentications from 127.0.0.1" in refused.json()["error"]
    assert 1 <= int(refused["Retry-After"]) <= 61
    # A good token from that address is refused too: otherwise a guesser would learn which guess is right.
    assert api("viewer").get("/api/v1/me/").status_code == 429
    tokens.auth_failures_clear(client="127.0.0.1")
    assert api("viewer").get("/api/v1/me/").status_code == 200


def test_good_tokens_are_not_counted_against_the_address(people, api, settings):
    settings.EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE = 2
    _clear_of_the_minutes_end()
    assert {api("viewer").get("/api/v1/me/").status_code for _ in range(5)} == {200}


def test_everything_a_token_does_is_in_the_audit_trail_with_its_user(people, api, roots):
    user, secret = people["launcher"]
    client = api("launcher")
    client.get("/api/v1/runs/?status=running")
    client.post("/api/v1/runs/", {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "epochs": 0})
    client.post("/api/v1/runs/999999/cancel/")
    rows = list(ApiAuditEntry.objects.filter(user=user).order_by("id").values_list(
        "token__name", "token_prefix", "method", "path", "status"))
    assert rows == [
        ("launcher tests", secret[:12], "GET", "/api/v1/runs/?status=running", 200),
        ("launcher tests", secret[:12], "POST", "/api/v1/runs/", 400),
        ("launcher tests", secret[:12], "POST", "/api/v1/runs/999999/cancel/", 404),
    ]


def test_a_browser_sessions_writes_need_its_csrf_token_and_are_audited(people):
    user, _ = people["launcher"]
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get("/api/v1/me/").json()["token"] is None  # reads with the session work
    response = client.post("/api/v1/runs/1/cancel/", "{}", content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]
    client.get("/account/")  # a page with a form hands the browser its CSRF cookie
    response = client.post("/api/v1/runs/999999/cancel/", "{}", content_type="application/json",
                           HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert response.status_code == 404
    # The refused one was no one's request (the session was not accepted); the other is the user's.
    assert list(ApiAuditEntry.objects.values_list("user__username", "token", "method", "path", "status")) == [
        ("api-launcher", None, "POST", "/api/v1/runs/999999/cancel/", 404)]


def test_create_api_token_prints_a_working_token_as_json(people):
    out = io.StringIO()
    call_command("create_api_token", "api-reviewer", "--name", "ci", "--json", stdout=out)
    made = json.loads(out.getvalue())
    assert (made["user"], made["name"], made["roles"]) == ("api-reviewer", "ci", ["reviewer"])
    assert made["prefix"] == made["token"][:12]
    assert ApiClient(made["token"]).get("/api/v1/me/").json()["token"]["name"] == "ci"


def test_create_api_token_for_nobody_says_so(db):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_api_token", "ghost", "--json", stdout=io.StringIO())
    assert ApiToken.objects.count() == 0


def test_the_account_page_shows_a_new_secret_once_and_revokes(people):
    user = get_user_model().objects.create_user("page-user")
    client = Client()
    client.force_login(user)
    made = client.post("/account/", {"name": "laptop notebook"})
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    row = ApiToken.objects.get(user=user)
    secret = made.context["secret"]
    assert secret.encode() in made.content and row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    ApiClient(secret).get("/api/v1/me/")
    again = client.get("/account/")
    assert secret.encode() not in again.content
    assert row.prefix.encode() in again.content and b"laptop notebook" in again.content
    assert b"never" not in again.content.split(b'id="tokens"')[1].split(b"</table>")[0]  # last use shown
    assert client.post(f"/account/tokens/{row.pk}/revoke/").status_code == 302
    assert ApiClient(secret).get("/api/v1/me/").status_code == 401


def test_a_token_without_a_name_is_refused_on_the_page(db):
    user = get_user_model().objects.create_user("page-user")
    client = Client()
    client.force_login(user)
    response = client.post("/account/", {"name": "  "})
    assert response.status_code == 400 and b"name the token" in response.content
    assert ApiToken.objects.count() == 0


def test_nobody_revokes_another_users_token(people):
    owner, secret = people["launcher"]
    client = Client()
    client.force_login(people["other_launcher"][0])
    assert client.post(f"/account/tokens/{ApiToken.objects.get(user=owner).pk}/revoke/").status_code == 404
    assert ApiClient(secret).get("/api/v1/me/").status_code == 200


def test_the_admin_lists_tokens_without_their_hash(people):
    admin, _ = people["admin"]
    row = ApiToken.objects.get(user=people["launcher"][0])
    client = Client()
    client.force_login(admin)
    for url in ("/admin/runs/apitoken/", f"/admin/runs/apitoken/{row.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200 and row.prefix.encode() in page.content
        assert row.secret_hash.encode() not in page.content
    response = client.post("/admin/runs/apitoken/", {"action": "revoke", "_selected_action": [row.pk]})
    assert response.status_code == 302
    assert ApiClient(people["launcher"][1]).get("/api/v1/me/").status_code == 401
