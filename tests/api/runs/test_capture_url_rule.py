"""Capture URLs follow the webhook rule (issue 34): a worker sends GET and POST requests to each, so a launch
that names one the capture host rule refuses (EAGLE3WEB_CAPTURE_ALLOWED_HOSTS: a decimal spelling of
loopback, the metadata address, a private or loopback address not listed) answers 400 naming capture_urls
through the API, the form and run_pipeline, and stores nothing; a listed host passes."""
from __future__ import annotations

import os

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from runs.models import PendingEnqueue, PipelineRun
from workers.contract.inputs.host_rule import HostRefused, check_url

pytestmark = pytest.mark.django_db

ONLINE = {"hidden_states": "online", "capture_servers": 0, "hidden_states_cache_gib": 2.5}
REFUSED = [
    ("http://2130706433:8000", "URL 1 'http://2130706433:8000': capture server host '2130706433' is an address in "
                               "an unusual spelling: write it as a.b.c.d"),
    ("http://0177.0.0.1:8000", "is an address in an unusual spelling"),
    ("http://169.254.169.254:80", "capture server host '169.254.169.254' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"),
    ("http://192.168.1.5:8000", "capture server host '192.168.1.5' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"),
    ("http://127.0.0.1:8000", "capture server host '127.0.0.1' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"),
    ("http://localhost:8000", "capture server host 'localhost' is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"),
    ("http://10.0.0.7:8000/v1/../../admin", "path may not hold '.' or '..' segments"),
]


def body(roots, **over) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "draft_vocab_size": 64, **over}


def stored() -> tuple[int, int]:
    return PipelineRun.objects.count(), PendingEnqueue.objects.count()


@pytest.mark.parametrize(("url", "words"), REFUSED)
def test_the_api_refuses_a_capture_url_the_rule_refuses_and_stores_nothing(api, roots, settings, url, words):
    settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS = ["10.0.0.0/8"]
    before = stored()
    response = api("launcher").post("/api/v1/runs/", body(roots, **ONLINE, capture_urls=[url]))
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["capture_urls"]
    assert words in response.json()["fields"]["capture_urls"], response.json()
    assert stored() == before


@pytest.mark.parametrize(("url", "words"), REFUSED[::3])
def test_the_form_refuses_it_under_the_field(people, roots, settings, url, words):
    settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS = ["10.0.0.0/8"]
    browser = Client()
    browser.force_login(people["launcher"][0])
    response = browser.post("/runs/new/", {
        "target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "draft_vocab_size": 64,
        "max_seq_len": 512, "epochs": 2, "lr": 3e-4, "ttt_steps": 3, **ONLINE, "capture_urls": url})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == ["capture_urls"] and words in errors["capture_urls"][0]
    assert stored() == (0, 0)


def test_run_pipeline_refuses_it_naming_the_flag(people, roots, settings):
    settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS = []
    with pytest.raises(CommandError, match="--capture-url 1 'http://10.0.0.7:8000': capture server host '10.0.0.7' "
                                           r"is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS \(allowed: none\)"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--hidden-states", "online", "--capture-servers", "0", "--capture-url", "http://10.0.0.7:8000",
                     "--user", people["launcher"][0].username)
    assert stored() == (0, 0)


def test_a_listed_host_passes_and_loopback_only_when_listed(api, roots, settings):
    settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS = ["127.0.0.1", "192.168.1.5"]
    response = api("launcher").post("/api/v1/runs/", body(
        roots, **ONLINE, capture_urls=["http://127.0.0.1:8000", "http://192.168.1.5:8001"]))
    assert response.status_code == 201, response.json()
    assert PipelineRun.objects.get().config["capture_urls"] == ["http://127.0.0.1:8000", "http://192.168.1.5:8001"]


def test_the_setting_lists_nothing_by_default():
    from eagle3web import settings as defaults

    assert defaults.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS == [] or "EAGLE3WEB_CAPTURE_ALLOWED_HOSTS" in os.environ
    with pytest.raises(HostRefused, match="is not in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"):
        check_url("http://127.0.0.1:8000", allowed=[], setting="EAGLE3WEB_CAPTURE_ALLOWED_HOSTS",
                  what="capture server")


@pytest.mark.parametrize("url", ["http://u:p@10.0.0.7:8000", "http://0x0a000007:8000", "http://10.7:8000",
                                 "http://10.0.0.7:8000/%2e%2e/x"])
def test_odd_spellings_are_refused_whatever_is_listed(url):
    with pytest.raises(HostRefused):
        check_url(url, allowed=["10.0.0.0/8", "0x0a000007", "10.7"], setting="S", what="capture server")
