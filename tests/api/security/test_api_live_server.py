"""A script's view: a real HTTP server (pytest-django's live_server) and http.client, nothing of
Django's test client. A token made by create_api_token launches, watches and cancels a run; a revoked
one is refused; every answer is JSON."""
from __future__ import annotations

import http.client
import io
import json
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command

from runs.api import tokens
from runs.api.models import ApiAuditEntry, ApiToken
from tests.api.conftest import make_user


class Script:
    def __init__(self, base: str, token: str | None):
        self.netloc, self.token = urlsplit(base).netloc, token

    def __call__(self, method: str, path: str, body=None, headers: dict | None = None):
        connection = http.client.HTTPConnection(self.netloc, timeout=30)
        sent = {"Accept": "application/json", **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
                **(headers or {})}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        raw = response.read()
        connection.close()
        assert response.getheader("Content-Type") == "application/json", (method, path, raw[:200])
        return response.status, json.loads(raw), response


@pytest.fixture
def token(transactional_db):
    make_user("cluster-bot", "launcher")
    out = io.StringIO()
    call_command("create_api_token", "cluster-bot", "--name", "slurm", "--json", stdout=out)
    tokens.auth_failures_clear(client="127.0.0.1")
    return json.loads(out.getvalue())["token"]


def test_a_script_launches_watches_and_cancels_a_run_with_a_token(live_server, token, roots):
    api = Script(live_server.url, token)
    status, me, _ = api("GET", "/api/v1/me/")
    assert (status, me["username"], me["roles"], me["token"]["name"]) == (200, "cluster-bot", ["launcher"], "slurm")
    status, run, response = api("POST", "/api/v1/runs/", {
        "target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "layer_ids": [3, 6], "epochs": 1,
        "draft_vocab_size": 64, "name": "from a script"})
    assert status == 201 and response.getheader("Location") == f"{live_server.url}/api/v1/runs/{run['id']}/"
    status, watched, _ = api("GET", f"/api/v1/runs/{run['id']}/")
    assert (status, watched["name"], watched["status"], watched["config"]["layer_ids"]) == (
        200, "from a script", "queued", [3, 6, 8])
    status, listed, _ = api("GET", "/api/v1/runs/?owner=cluster-bot&sort=-created")
    assert [r["id"] for r in listed["results"]] == [run["id"]]
    assert api("POST", f"/api/v1/runs/{run['id']}/cancel/")[:2] == (200, {"id": run["id"], "cancelled": 5})
    assert api("GET", f"/api/v1/runs/{run['id']}/")[1]["status"] == "cancelled"
    assert list(ApiAuditEntry.objects.filter(user__username="cluster-bot").order_by("id")
                .values_list("method", "status")) == [
        ("GET", 200), ("POST", 201), ("GET", 200), ("GET", 200), ("POST", 200), ("GET", 200)]


def test_over_http_bad_tokens_bad_bodies_and_missing_things_are_json(live_server, token, roots):
    status, answer, response = Script(live_server.url, None)("GET", "/api/v1/runs/")
    assert status == 401 and response.getheader("WWW-Authenticate") == 'Bearer realm="eagle3web"'
    assert Script(live_server.url, "e3w_not-a-token")("GET", "/api/v1/runs/")[0] == 401
    api = Script(live_server.url, token)
    status, answer, _ = api("POST", "/api/v1/runs/", b'{"target": ')
    assert status == 400 and answer["error"].startswith("JSON parse error")
    status, answer, _ = api("POST", "/api/v1/runs/", {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"),
                                                       "layer_ids": "all"})
    assert status == 400 and list(answer["fields"]) == ["layer_ids"]
    assert api("GET", "/api/v1/runs/424242/")[:2] == (404, {"error": "no run 424242", "fields": {}})
    assert api("PATCH", "/api/v1/runs/")[0] == 405
    ApiToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
    status, answer, _ = api("GET", "/api/v1/me/")
    assert status == 401 and "was revoked at 2026-01-01 00:00 UTC" in answer["error"]
