"""Redis really stopped (a private redis-server, the failed-authentication cache and the broker both on
it), no mock: tokens still authenticate (200) or are refused (401), never a 500, the failures counted in
the process's memory meanwhile; a launch answers 201 with its run, stored once, its hand-over waiting in
the outbox, which delivers it once Redis is back."""
from __future__ import annotations

import json
import time

import pytest
import redis as redis_client

from runs.api import tokens
from runs.models import PendingEnqueue, PipelineRun
from runs.pipeline.dispatch.queue import RETRY_AFTER, outbox_flush
from tests.api.conftest import ApiClient
from tests.api.runs.test_api_runs import body
from tests.helpers.outage import celery_broker, private_redis

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def redis(settings, tmp_path):
    """A redis-server of the test's own as the auth-failures cache and the broker, running."""
    with private_redis(log_path=tmp_path / "redis.log") as server, celery_broker(server.url):
        settings.CACHES = {**settings.CACHES, "auth_failures": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": server.url,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}}}
        tokens._cache_state["down_until"] = 0.0  # a previous test's outage is not this one's
        yield server


def _away_from_a_minute_boundary() -> None:
    # Failures are counted in clock minutes: a test that counts some must not straddle two.
    if 60 - time.time() % 60 < 8:
        time.sleep(60 - time.time() % 60 + 0.5)


def test_tokens_answer_200_or_401_while_redis_is_down(redis, people, settings):
    good, bad = ApiClient(people["viewer"][1]), ApiClient("e3w_" + "x" * 43)
    assert good.get("/api/v1/me/").status_code == 200
    redis.stop()
    for _ in range(3):
        assert good.get("/api/v1/me/").status_code == 200
        answer = bad.get("/api/v1/me/")
        assert answer.status_code == 401 and answer.json()["error"].startswith("the token is not known")
    redis.start()
    time.sleep(tokens.RETRY_CACHE_SECONDS)
    assert good.get("/api/v1/me/").status_code == 200
    assert bad.get("/api/v1/me/").status_code == 401


def test_bad_tokens_are_still_limited_while_redis_is_down_in_our_words(redis, people, settings):
    settings.EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE = 3
    _away_from_a_minute_boundary()
    redis.stop()
    bad = ApiClient("e3w_" + "y" * 43)
    assert [bad.get("/api/v1/me/").status_code for _ in range(3)] == [401] * 3
    refused = ApiClient(people["viewer"][1]).get("/api/v1/me/")  # a good token too, from that address
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    error = refused.json()["error"]
    assert error.startswith("too many failed authentications from 127.0.0.1") and error.endswith(" s with a valid token")
    assert "Expected available" not in error


def test_a_launch_while_redis_is_down_answers_201_with_its_run_and_the_outbox_delivers_it(redis, people, api, roots):
    redis.stop()
    answer = api("launcher").post("/api/v1/runs/", body(roots, name="in the outage"))
    assert answer.status_code == 201, answer.content
    run = answer.json()
    assert run["name"] == "in the outage" and run["status"] == "queued"
    assert run["waiting_for_queue"]["attempts"] == 1 and run["waiting_for_queue"]["last_error"]
    assert list(PipelineRun.objects.values_list("pk", flat=True)) == [run["id"]]
    waiting = dict(PendingEnqueue.objects.values_list("kind", "object_id"))  # the dataset's catalogue job too
    assert waiting["pipeline"] == run["id"] and set(waiting) == {"pipeline", "catalogue"}
    assert api("launcher").get(f"/api/v1/runs/{run['id']}/").json()["waiting_for_queue"]["attempts"] == 1

    redis.start()  # same port, empty: only the outbox knows of the run
    time.sleep(RETRY_AFTER.total_seconds())  # the reconcilers leave rows this young to their own delivery
    assert outbox_flush() == 2
    assert not PendingEnqueue.objects.exists()
    queued = [json.loads(m)["headers"]["task"] for m in redis_client.Redis.from_url(redis.url).lrange("cpu", 0, -1)]
    assert sorted(queued) == ["eagle3web.job", "eagle3web.stage"]  # the catalogue; the run's first stage
    assert api("launcher").get(f"/api/v1/runs/{run['id']}/").json()["waiting_for_queue"] is None
