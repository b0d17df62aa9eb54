"""POST /api/v1/runs/ with an Idempotency-Key: the same key and body again answer the first run (201, then
200 with that run), another body is a 409, a key past its day launches anew, two requests racing with one
key launch once, and eagle3web_client's launch through a proxy that loses its first answer ends with one
run. Bad keys are a 400 naming the header."""
from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from eagle3web_client import Client as ApiScriptClient
from runs.api.bodies import idempotency
from runs.api.models import LaunchIdempotencyKey
from runs.api.schema import api_schema
from runs.pipeline import services
from runs.pipeline.models import PipelineRun
from tests.client.conftest import FaultyProxy


def body(roots, **over) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "draft_vocab_size": 64, **over}


def post(people, role: str, data, key: str | None = None):
    """POST /api/v1/runs/ with the role's token and, when given, the key (Django's test client: any
    header value can be sent, control characters included)."""
    extra = {"HTTP_AUTHORIZATION": f"Bearer {people[role][1]}"}
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return Client().post("/api/v1/runs/", json.dumps(data), content_type="application/json", **extra)


@pytest.mark.django_db
def test_the_same_key_and_body_twice_launch_one_run(people, roots):
    first = post(people, "launcher", body(roots, name="once"), key="k-1")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    again = post(people, "launcher", body(roots, name="once"), key="k-1")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again["Location"] == first["Location"]
    assert again.json() == first.json()  # the run as it is now: nothing happened to it in between
    assert PipelineRun.objects.count() == 1
    row = LaunchIdempotencyKey.objects.get()
    assert (row.user, row.key, row.run_id) == (people["launcher"][0], "k-1", first.json()["id"])
    assert row.body_sha256 == idempotency.body_sha256(body(roots, name="once"))
    # The same body with its keys in another order is the same body.
    reordered = dict(reversed(list(body(roots, name="once").items())))
    assert post(people, "launcher", reordered, key="k-1").status_code == 200
    # Without a key every POST launches, as before; another key is another launch.
    assert post(people, "launcher", body(roots, name="once")).status_code == 201
    assert post(people, "launcher", body(roots, name="once"), key="k-2").status_code == 201
    assert PipelineRun.objects.count() == 3


@pytest.mark.django_db
def test_another_body_with_the_key_is_a_409_and_launches_nothing(people, roots):
    first = post(people, "launcher", body(roots, epochs=1), key="k-1")
    assert first.status_code == 201
    other = post(people, "launcher", body(roots, epochs=2), key="k-1")
    assert other.status_code == 409
    answer = other.json()
    assert list(answer) == ["error", "fields"] and list(answer["fields"]) == ["Idempotency-Key"]
    assert "with another body" in answer["error"] and f"run {first.json()['id']}" in answer["error"]
    # An external run's body with a pipeline launch's key is another body too.
    external = post(people, "launcher", {"external": True, "name": "elsewhere", "config": {}}, key="k-1")
    assert external.status_code == 409
    assert PipelineRun.objects.count() == 1 and LaunchIdempotencyKey.objects.get().run_id == first.json()["id"]


@pytest.mark.django_db
def test_keys_are_per_user(people, roots):
    mine = post(people, "launcher", body(roots), key="shared")
    theirs = post(people, "other_launcher", body(roots), key="shared")
    assert (mine.status_code, theirs.status_code) == (201, 201) and mine.json()["id"] != theirs.json()["id"]
    assert PipelineRun.objects.get(pk=theirs.json()["id"]).owner == people["other_launcher"][0]


@pytest.mark.django_db
def test_a_key_past_its_day_launches_anew_and_its_row_is_replaced(people, roots):
    first = post(people, "launcher", body(roots), key="k-1")
    LaunchIdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=24, seconds=1))
    again = post(people, "launcher", body(roots, epochs=2), key="k-1")  # another body is fine once it has expired
    assert again.status_code == 201 and again.json()["id"] != first.json()["id"]
    row = LaunchIdempotencyKey.objects.get()
    assert row.run_id == again.json()["id"] and timezone.now() - row.created_at < timedelta(minutes=1)
    assert row.body_sha256 == idempotency.body_sha256(body(roots, epochs=2))
    # Within the day of its new row, the key answers the new run.
    LaunchIdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=23, minutes=59))
    assert post(people, "launcher", body(roots, epochs=2), key="k-1").json()["id"] == again.json()["id"]
    assert PipelineRun.objects.count() == 2


@pytest.mark.django_db
def test_a_refused_launch_keeps_no_key(people, roots):
    refused = post(people, "launcher", body(roots, layer_ids="all"), key="k-1")
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["layer_ids"]
    assert not LaunchIdempotencyKey.objects.exists()
    # The corrected body with the same key launches: the refusal claimed nothing.
    assert post(people, "launcher", body(roots), key="k-1").status_code == 201
    # A viewer may not launch: the key is not kept for them either.
    assert post(people, "viewer", body(roots), key="k-v").status_code == 403
    assert list(LaunchIdempotencyKey.objects.values_list("key", flat=True)) == ["k-1"]


@pytest.mark.django_db
@pytest.mark.parametrize("key, why", [
    ("k" * 201, "1 to 200 characters, got 201"), ("", "1 to 200 characters, got 0"),
    ("a\x01b", "control characters"), ("tab\there", "control characters"), ("del\x7f", "control characters"),
    ("c1\x85", "control characters"),
])
def test_a_bad_key_is_a_400_naming_the_header(people, roots, key, why):
    answer = post(people, "launcher", body(roots), key=key)
    assert answer.status_code == 400 and why in answer.json()["error"]
    assert list(answer.json()["fields"]) == ["Idempotency-Key"]
    assert not PipelineRun.objects.exists()


@pytest.mark.django_db
def test_the_longest_key_is_taken(people, roots):
    assert post(people, "launcher", body(roots), key="k" * 200).status_code == 201
    assert post(people, "launcher", body(roots), key="k" * 200).status_code == 200


@pytest.mark.django_db
def test_an_external_run_with_the_same_key_is_made_once(people):
    external = {"external": True, "name": "llama on slurm", "config": {"epochs": 2}}
    first = post(people, "launcher", external, key="ext-1")
    assert first.status_code == 201 and first.json()["external"] is True
    again = post(people, "launcher", external, key="ext-1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert post(people, "launcher", {**external, "name": "another"}, key="ext-1").status_code == 409
    assert PipelineRun.objects.filter(external=True).count() == 1


def test_two_requests_racing_with_one_key_launch_one_run(transactional_db, people, roots, monkeypatch):
    """The first request is made to launch slowly; the second arrives while the first holds the key
    uncommitted, waits on its claim, and answers the first's run."""
    launching = threading.Event()
    real_launch = services.run_launch

    def slow_launch(**kwargs):
        launching.set()
        time.sleep(1.0)  # the second request reaches its claim meanwhile
        return real_launch(**kwargs)

    monkeypatch.setattr(services, "run_launch", slow_launch)
    answers: dict[str, object] = {}

    def send(name: str) -> None:
        try:
            answers[name] = post(people, "launcher", body(roots), key="race")
        finally:
            connections.close_all()

    first = threading.Thread(target=send, args=("first",))
    first.start()
    assert launching.wait(timeout=30)
    second = threading.Thread(target=send, args=("second",))
    second.start()
    first.join(timeout=60)
    second.join(timeout=60)
    assert (answers["first"].status_code, answers["second"].status_code) == (201, 200)
    assert answers["first"].json()["id"] == answers["second"].json()["id"]
    assert PipelineRun.objects.count() == 1 and LaunchIdempotencyKey.objects.count() == 1


def test_the_same_launch_sent_again_through_a_proxy_that_lost_its_answer_launches_once(
        transactional_db, live_server, people, roots):
    """The required case: the launch reaches the server, the proxy closes the connection without its
    answer; eagle3web_client sends it again with the same key and gets the run the first made."""
    proxy = FaultyProxy(live_server.url)
    try:
        proxy.faults = [("POST", "/api/v1/runs/", "drop")]
        with ApiScriptClient(proxy.url, people["launcher"][1], backoff_seconds=0.05) as client:
            run = client.runs.launch(**body(roots, name="lost answer"))
            assert client.retried == 1
        assert [s for m, _, s in proxy.seen if m == "POST"] == ["dropped 201", "200"]
        assert list(PipelineRun.objects.values_list("pk", "name")) == [(run["id"], "lost answer")]
        assert LaunchIdempotencyKey.objects.get().run_id == run["id"]
    finally:
        proxy.close()


@pytest.mark.django_db
def test_the_schema_and_the_docs_page_name_the_header(people):
    operation = api_schema()["paths"]["/api/v1/runs/"]["post"]
    header = [p for p in operation["parameters"] if p["in"] == "header"]
    assert [(p["name"], p["required"]) for p in header] == [("Idempotency-Key", False)]
    assert {"200", "201", "400", "409"} <= set(operation["responses"])
    assert operation["responses"]["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    browser = Client()
    browser.force_login(people["viewer"][0])
    assert "Idempotency-Key" in browser.get("/api/v1/").content.decode()
