"""eagle3web_client.Client against a real server (live_server): list, get, launch, cancel and wait as a
script does them; errors as ApiError with the server's status and fields; what is retried and what is not,
through a real proxy that loses answers (a launch is sent again with its Idempotency-Key and launches once)."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from eagle3web_client import ApiError, Client, WaitTimeout
from runs.pipeline import services
from runs.pipeline.models import PipelineRun
from tests.api.conftest import make_user
from runs.api.models import ApiToken, LaunchIdempotencyKey
from runs.pipeline.launch.run_config import RunConfig


def _launch_body(roots, **extra) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "layer_ids": [3, 6], "epochs": 1,
            "draft_vocab_size": 64, **extra}


def test_a_script_launches_lists_gets_and_cancels_a_run(live_server, launcher_token, roots):
    with Client(live_server.url, launcher_token) as client:
        assert client.me()["username"] == "cluster-bot"
        run = client.runs.launch(**_launch_body(roots, name="from the client"))
        assert list(run)[0] == "id" and run["name"] == "from the client" and run["status"] == "queued"
        stored = PipelineRun.objects.get(pk=run["id"])
        assert (stored.owner.username, stored.config["layer_ids"], stored.config["epochs"]) == ("cluster-bot", [3, 6, 8], 1)
        got = client.runs.get(run["id"])
        assert (got["id"], got["config"]["layer_ids"], got["finished"]) == (run["id"], [3, 6, 8], False)
        assert [r["id"] for r in client.runs.list(owner="cluster-bot")] == [run["id"]]
        assert client.runs.list(owner="nobody-at-all") == []
        assert client.runs.cancel(run["id"]) == {"id": run["id"], "cancelled": 5}
        assert client.runs.get(run["id"])["status"] == "cancelled"


def test_list_follows_pages_up_to_its_limit(live_server, launcher_token, roots):
    owner = make_user("many-runs", "launcher")
    made = [services.run_launch(user=owner, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                config=RunConfig(draft_vocab_size=64), name=f"r{i}", enqueue=False).pk
            for i in range(53)]  # the API lists 50 a page
    with Client(live_server.url, launcher_token) as client:
        assert [r["id"] for r in client.runs.list(sort="created", limit=100)] == made
        assert [r["id"] for r in client.runs.list(sort="-created", limit=52)] == made[::-1][:52]
        assert [r["id"] for r in client.runs.list(sort="created")] == made[:50]
        assert [r["name"] for r in client.runs.list(q="r52")] == ["r52"]


def test_wait_returns_the_run_once_something_else_ends_it(live_server, launcher_token, roots):
    with Client(live_server.url, launcher_token) as client:
        run = client.runs.launch(**_launch_body(roots))
        answer: dict = {}
        waiter = threading.Thread(target=lambda: answer.update(client.runs.wait(run["id"], timeout=60, poll=0.2)))
        started = time.monotonic()
        waiter.start()
        time.sleep(1.0)
        assert waiter.is_alive() and not answer  # still queued: wait keeps polling
        stored = PipelineRun.objects.get(pk=run["id"])
        services.run_cancel(run=stored, user=stored.owner)  # the run ends elsewhere (the page, another script)
        waiter.join(timeout=30)
        assert not waiter.is_alive() and time.monotonic() - started < 30
        assert (answer["id"], answer["status"], answer["finished"]) == (run["id"], "cancelled", True)
        assert {s["status"] for s in answer["stages"]} == {"cancelled"}


def test_wait_raises_wait_timeout_with_the_last_answer(live_server, launcher_token, roots):
    with Client(live_server.url, launcher_token) as client:
        run = client.runs.launch(**_launch_body(roots))
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as raised:
            client.runs.wait(run["id"], timeout=0.6, poll=0.2)
        assert 0.6 <= time.monotonic() - started < 10
        assert raised.value.run["status"] == "queued" and isinstance(raised.value, ApiError)
        assert str(raised.value) == f"run {run['id']} is still queued after 0.6 s"


def test_a_bad_token_raises_api_error_401(live_server, transactional_db):
    with Client(live_server.url, "e3w_not-a-token") as client, pytest.raises(ApiError) as raised:
        client.runs.list()
    assert raised.value.status == 401 and raised.value.fields == {}
    assert "token" in raised.value.error.lower()
    assert client.retried == 0  # a 4xx is never sent again


def test_a_refused_launch_names_its_field_and_stores_nothing(live_server, launcher_token, roots):
    with Client(live_server.url, launcher_token) as client:
        with pytest.raises(ApiError) as raised:
            client.runs.launch(target=str(roots / "target"), dataset=str(roots / "chats.jsonl"), layer_ids="all")
        assert raised.value.status == 400 and list(raised.value.fields) == ["layer_ids"]
        with pytest.raises(ApiError) as unknown:
            client.runs.launch(**_launch_body(roots, epoch=3))
        assert unknown.value.status == 400 and list(unknown.value.fields) == ["epoch"]
        with pytest.raises(ApiError) as missing:
            client.runs.get(424242)
        assert (missing.value.status, missing.value.error) == (404, "no run 424242")
    assert PipelineRun.objects.count() == 0


def test_a_lost_answer_to_a_read_or_a_cancel_is_asked_again(proxy, launcher_token, roots):
    client = Client(proxy.url, launcher_token, backoff_seconds=0.05)
    run = client.runs.launch(**_launch_body(roots))
    proxy.faults = [("GET", f"/api/v1/runs/{run['id']}/", "drop"), ("POST", f"/api/v1/runs/{run['id']}/cancel/", "drop"),
                    ("GET", f"/api/v1/runs/{run['id']}/", "503")]
    assert client.runs.get(run["id"])["id"] == run["id"]
    # The first cancel reached the server and cancelled the five stages; its answer was lost; the
    # second finds nothing left to cancel.
    assert client.runs.cancel(run["id"]) == {"id": run["id"], "cancelled": 0}
    assert client.runs.get(run["id"])["status"] == "cancelled"
    # The read: lost, then 503 (its second fault), then answered; the cancel: lost, then answered.
    assert [s for _, p, s in proxy.seen if p != "/api/v1/runs/"] == ["dropped 200", "503", "200", "dropped 200", "200",
                                                                     "200"]
    assert client.retried == 3


def test_a_launch_whose_answer_was_lost_is_sent_again_with_its_key_and_launches_once(proxy, launcher_token, roots):
    client = Client(proxy.url, launcher_token, backoff_seconds=0.05)
    proxy.faults = [("POST", "/api/v1/runs/", "drop"), ("POST", "/api/v1/runs/", "503")]
    run = client.runs.launch(**_launch_body(roots))
    # Launched by the first try (its answer lost); the second met a 503; the third answered the first's run.
    assert [s for m, _, s in proxy.seen if m == "POST"] == ["dropped 201", "503", "200"]
    assert list(PipelineRun.objects.values_list("pk", flat=True)) == [run["id"]] and client.retried == 2
    keys = list(LaunchIdempotencyKey.objects.values_list("key", flat=True))
    assert len(keys) == 1 and uuid.UUID(keys[0]).version == 4
    # The next call is a new launch: a fresh key.
    proxy.faults = [("POST", "/api/v1/runs/", "429")]  # refused before anything was done: sent again
    second = client.runs.launch(**_launch_body(roots))
    assert second["id"] != run["id"] and PipelineRun.objects.count() == 2
    assert [s for m, _, s in proxy.seen if m == "POST"][3:] == ["429", "201"]
    assert LaunchIdempotencyKey.objects.count() == 2 and client.retried == 3


def test_a_key_the_caller_passes_answers_the_run_it_launched(live_server, launcher_token, roots):
    with Client(live_server.url, launcher_token) as client:
        run = client.runs.launch(**_launch_body(roots), idempotency_key="job-4711-launch")
        # A job that restarted after a crash sends its launch again with its key: the same run.
        assert client.runs.launch(**_launch_body(roots), idempotency_key="job-4711-launch")["id"] == run["id"]
        with pytest.raises(ApiError) as changed:
            client.runs.launch(**_launch_body(roots, epochs=2), idempotency_key="job-4711-launch")
        assert changed.value.status == 409 and list(changed.value.fields) == ["Idempotency-Key"]
        assert client.retried == 0  # a 409 is not sent again
        external = client.runs.create_external(name="elsewhere", config={"epochs": 1}, idempotency_key="job-4711-ext")
        assert client.runs.create_external(name="elsewhere", config={"epochs": 1},
                                           idempotency_key="job-4711-ext")["id"] == external["id"]
    assert PipelineRun.objects.count() == 2
    assert LaunchIdempotencyKey.objects.get(key="job-4711-ext").run_id == external["id"]


def test_an_external_run_whose_answer_was_lost_is_made_once(proxy, launcher_token):
    client = Client(proxy.url, launcher_token, backoff_seconds=0.05)
    proxy.faults = [("POST", "/api/v1/runs/", "drop")]
    run = client.runs.create_external(name="llama on slurm", config={"epochs": 2})
    assert [s for m, _, s in proxy.seen if m == "POST"] == ["dropped 201", "200"]
    assert list(PipelineRun.objects.values_list("pk", "external")) == [(run["id"], True)]


def test_ending_a_run_whose_answer_was_lost_is_not_sent_again(proxy, launcher_token):
    """Writes without a key stay as they were: sent again only when they cannot have been acted on."""
    client = Client(proxy.url, launcher_token, backoff_seconds=0.05)
    run = client.runs.create_external(name="llama on slurm")
    proxy.faults = [("POST", f"/api/v1/runs/{run['id']}/end/", "drop")]
    with pytest.raises(ApiError) as raised:
        client.runs.end(run["id"], status="succeeded")
    assert raised.value.status is None and "could not reach" in raised.value.error and client.retried == 0
    assert client.runs.get(run["id"])["status"] == "succeeded"  # it did end: its answer was lost


def test_an_unreachable_server_is_an_api_error_after_the_retries(transactional_db):
    client = Client("http://127.0.0.1:9", "e3w_x", backoff_seconds=0.01, retries=2)
    with pytest.raises(ApiError) as raised:
        client.runs.get(1)
    assert raised.value.status is None and raised.value.error.startswith("could not reach http://127.0.0.1:9")
    assert client.retried == 2


def test_a_revoked_token_is_refused(live_server, launcher_token):
    with Client(live_server.url, launcher_token) as client:
        assert client.runs.list() == []
        ApiToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
        with pytest.raises(ApiError) as raised:
            client.runs.list()
        assert raised.value.status == 401
