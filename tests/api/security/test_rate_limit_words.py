"""Every 429 the API answers says in our words how long to wait, with Retry-After (issue 28): the
failed-authentication limit, and a DRF throttle wherever one is configured (DRF's own Throttled says
"Request was throttled. Expected available in N seconds.")."""
from __future__ import annotations

import time

import pytest
from rest_framework.throttling import BaseThrottle

from runs.api.base import ApiView
from tests.api.conftest import ApiClient

pytestmark = pytest.mark.django_db


def _no_framework_words(error: str) -> None:
    assert "Expected available" not in error and "throttled" not in error.lower() and "seconds." not in error


class RefuseFor31Seconds(BaseThrottle):
    def allow_request(self, request, view):
        return False

    def wait(self):
        return 30.2  # DRF rounds up: 31


class RefuseWithoutSayingHowLong(BaseThrottle):
    def allow_request(self, request, view):
        return False

    def wait(self):
        return None


def test_a_drf_throttle_on_the_api_says_how_long_to_wait_in_our_words(people, api, monkeypatch):
    monkeypatch.setattr(ApiView, "throttle_classes", [RefuseFor31Seconds])
    for path in ("/api/v1/me/", "/api/v1/runs/"):
        refused = api("viewer").get(path)
        assert refused.status_code == 429 and refused["Retry-After"] == "31"
        error = refused.json()["error"]
        assert error == "too many requests from this client; try again in 31 s"
        assert refused.json()["fields"] == {}
        _no_framework_words(error)


def test_a_drf_throttle_that_names_no_wait_says_later_and_sends_no_retry_after(people, api, monkeypatch):
    monkeypatch.setattr(ApiView, "throttle_classes", [RefuseWithoutSayingHowLong])
    refused = api("launcher").post("/api/v1/runs/", {})
    assert refused.status_code == 429 and "Retry-After" not in refused
    assert refused.json()["error"] == "too many requests from this client; try again later"


def test_the_failed_authentication_limit_says_how_long_to_wait_in_our_words(people, settings):
    settings.EAGLE3WEB_API_AUTH_FAILURES_PER_MINUTE = 2
    if 60 - time.time() % 60 < 8:  # failures are counted in clock minutes: not across two
        time.sleep(60 - time.time() % 60 + 0.5)
    bad = ApiClient("e3w_" + "z" * 43)
    assert [bad.get("/api/v1/runs/").status_code for _ in range(2)] == [401, 401]
    refused = bad.get("/api/v1/runs/")
    wait = int(refused["Retry-After"])
    assert refused.status_code == 429 and 1 <= wait <= 61
    error = refused.json()["error"]
    assert error.endswith(f"try again in {wait} s with a valid token")
    _no_framework_words(error)
