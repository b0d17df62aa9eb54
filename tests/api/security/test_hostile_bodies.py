"""Hostile JSON bodies are refused in the API's error shape, not crashed on: nesting past the limit is a
400 (Python's json would raise RecursionError past ~1,000 levels), a body past
DATA_UPLOAD_MAX_MEMORY_SIZE a 413; nothing is stored. The widest legitimate body, a batch of 10,000
metric points, still fits."""
from __future__ import annotations

import json

import pytest
from django.conf import settings

from runs.api.bodies.parsers import MAX_DEPTH, json_depth
from runs.models import MetricSeries
from tests.api.runs.test_api_runs import body, counts

pytestmark = pytest.mark.django_db


@pytest.fixture
def external_run(api) -> int:
    answer = api("launcher").post("/api/v1/runs/", {"external": True, "name": "elsewhere", "config": {}})
    assert answer.status_code == 201
    return answer.json()["id"]


@pytest.fixture
def endpoints(external_run, roots):
    """One endpoint of each family that takes a body: a launch, an external run's points, a run's tags,
    a dataset import."""
    return {"launch": ("/api/v1/runs/", body(roots)), "metrics": (f"/api/v1/runs/{external_run}/metrics/", {
        "points": [{"key": "loss", "split": "train", "step": 0, "value": 1.0}]}),
        "tags": (f"/api/v1/runs/{external_run}/tags/", {"tags": ["a"]}),
        "dataset": ("/api/v1/datasets/", {"path": str(roots / "chats.jsonl")})}


def _post(api, url: str, raw: bytes):
    client = api("launcher")
    return client.client.post(url, raw, content_type="application/json", HTTP_AUTHORIZATION=client.header)


@pytest.mark.parametrize("family", ["launch", "metrics", "tags", "dataset"])
def test_json_nested_5000_deep_is_a_400_naming_the_limit_and_stores_nothing(api, endpoints, family):
    url, _ = endpoints[family]
    before = counts()
    answer = _post(api, url, b'{"points": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert answer.status_code == 400 and answer["Content-Type"] == "application/json"
    assert answer.json() == {"error": f"the JSON body nests 5001 levels deep; at most {MAX_DEPTH} are accepted",
                             "fields": {}}
    assert counts() == before


@pytest.mark.parametrize("family", ["launch", "metrics", "tags", "dataset"])
def test_a_body_past_the_upload_limit_is_a_413_in_json_and_stores_nothing(api, endpoints, family):
    url, good = endpoints[family]
    before = counts()
    raw = json.dumps({**good, "padding": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE}).encode()
    answer = _post(api, url, raw)
    assert answer.status_code == 413 and answer["Content-Type"] == "application/json"
    assert answer.json()["error"].startswith(f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes")
    assert counts() == before


def test_nesting_within_the_limit_is_accepted(api):
    config = {"optimizer": {"betas": [0.9, 0.95]}}
    for _ in range(MAX_DEPTH - 5):
        config = {"inner": config}
    answer = api("launcher").post("/api/v1/runs/", {"external": True, "name": "deep config", "config": config})
    assert answer.status_code == 201, answer.json()


def test_brackets_inside_strings_are_not_nesting():
    assert json_depth(b'{"a": "[[[{{{", "b": ["\\"]]]\\\\", {"c": "\\\\\\"{"}]}') == 3
    assert json_depth(b"[" * 70 + b"]" * 70) == 70


def test_the_widest_batch_of_10000_points_fits_the_upload_limit(api, external_run):
    points = [{"key": "k" * 50, "split": "train", "step": 10**9 + i, "value": -1.2345678901234567e-05, "epoch": 12}
              for i in range(10_000)]
    raw = json.dumps({"points": points}, indent=4).encode()
    assert len(raw) < settings.DATA_UPLOAD_MAX_MEMORY_SIZE / 3
    answer = _post(api, f"/api/v1/runs/{external_run}/metrics/", raw)
    assert answer.status_code == 200, answer.json()
    assert answer.json()["accepted"] == 10_000
    assert MetricSeries.objects.get(training_run__run_id=external_run, key="k" * 50).num_points == 10_000


def test_a_token_in_the_query_string_is_neither_echoed_nor_recorded_whole(api, people):
    from runs.api.models import ApiAuditEntry

    secret = people["viewer"][1]
    answer = api("launcher").get("/api/v1/runs/", {"token": secret})
    assert answer.status_code == 400 and secret not in answer.content.decode()
    path = ApiAuditEntry.objects.get(status=400).path
    assert secret not in path and path.endswith(f"token={secret[:12]}…")
