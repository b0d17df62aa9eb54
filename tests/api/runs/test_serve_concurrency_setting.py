"""The run's `serve_concurrency` setting (issue 39: the serve check's load, concurrent requests of each level)
wherever a launch is made (API, the launch form, run_pipeline), refused naming the field when it is not 1 to 8
distinct whole numbers from 1 to 256, with nothing stored; a good list is stored in rising order and a
serve check of the run's checkpoint is asked with it."""
from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from runs.models import PendingEnqueue, PipelineRun

pytestmark = pytest.mark.django_db


def stored() -> tuple[int, int]:
    return PipelineRun.objects.count(), PendingEnqueue.objects.count()


def body(roots, **extra) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "draft_vocab_size": 64, **extra}


@pytest.mark.parametrize(("value", "words"), [
    ([0], "between 1 and 256 concurrent requests, got 0"),
    ([1, 257], "between 1 and 256 concurrent requests, got 257"),
    ([], "must list 1 to 8 concurrencies, got 0"),
    ([8, 8], "lists a concurrency twice: 8, 8"),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], "whole numbers separated by commas"),
    (["eight"], "A valid integer is required"),
    ([1.5], "A valid integer is required"),
    ("8", "Expected a list of items"),
])
def test_the_api_refuses_bad_concurrencies_naming_serve_concurrency_and_stores_nothing(api, roots, value, words):
    before = stored()
    response = api("launcher").post("/api/v1/runs/", body(roots, serve_concurrency=value))
    assert response.status_code == 400, response.json()
    fields = response.json()["fields"]
    assert list(fields) == ["serve_concurrency"], fields
    assert words in str(fields["serve_concurrency"]), fields
    assert stored() == before


def test_the_api_stores_the_levels_in_rising_order_and_the_default_when_omitted(api, roots):
    response = api("launcher").post("/api/v1/runs/", body(roots, serve_concurrency=[16, 1, 4]))
    assert response.status_code == 201, response.json()
    assert PipelineRun.objects.get(pk=response.json()["id"]).config["serve_concurrency"] == [1, 4, 16]
    response = api("launcher").post("/api/v1/runs/", body(roots))
    assert PipelineRun.objects.get(pk=response.json()["id"]).config["serve_concurrency"] == [1, 8, 32]


def test_the_form_refuses_them_under_the_field(people, roots):
    browser = Client()
    browser.force_login(people["launcher"][0])
    response = browser.post("/runs/new/", {
        "target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "draft_vocab_size": 64,
        "max_seq_len": 512, "epochs": 2, "lr": 3e-4, "ttt_steps": 3, "serve_concurrency": "1, 300"})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == ["serve_concurrency"] and "got 300" in errors["serve_concurrency"][0]
    assert stored() == (0, 0)


def test_run_pipeline_refuses_them_naming_the_flag(people, roots):
    with pytest.raises(CommandError, match="--serve-concurrency: serve_concurrency values must be between 1 and 256 "
                                           "concurrent requests, got 0"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--draft-vocab-size", "64", "--serve-concurrency", "0,8", "--user", people["launcher"][0].username)
    assert stored() == (0, 0)
