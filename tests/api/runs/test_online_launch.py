"""A run's hidden-state source is a setting (issue 27): `hidden_states` offline|online, `capture_urls`,
`capture_servers`, `hidden_states_cache_gib`, checked alike by RunConfig, the launch form, the API and
run_pipeline, each naming the field in its own words (flag words on the command line); nothing stored
when refused. An online run that starts capture servers needs a live worker with vLLM (its train stage
goes to vLLM's queue); one that only names running servers does not."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from runs.models import PendingEnqueue, PipelineRun
from runs.pipeline.dispatch.routing import stage_queue
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.selectors import launch_copy_initial
from tests.helpers.fleet import cpu_worker, fake_gpu_worker

pytestmark = pytest.mark.django_db

ONLINE = {"hidden_states": "online", "capture_servers": 0,
          "capture_urls": ["http://10.0.0.7:8000", "https://10.0.0.9:9443"],
          "hidden_states_cache_gib": 2.5}


def body(roots, **over) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "draft_vocab_size": 64, **over}


def stored() -> tuple[int, int]:
    return PipelineRun.objects.count(), PendingEnqueue.objects.count()


@pytest.mark.parametrize(("config", "field", "words"), [
    ({"hidden_states": "streamed"}, "hidden_states", "hidden_states must be one of offline, online"),
    ({"hidden_states": "online", "capture_urls": ["ftp://h:21"]}, "capture_urls",
     "capture_urls[1] 'ftp://h:21' must start with http:// or https://"),
    ({"hidden_states": "online", "capture_urls": ["http://10.0.0.1:1", "http://:8000"]}, "capture_urls",
     "capture_urls[2] 'http://:8000' names no host"),
    ({"hidden_states": "online", "capture_urls": ["http://h:70000"]}, "capture_urls", "has no valid port"),
    ({"hidden_states": "online", "capture_urls": ["http://h:8000?x=1"]}, "capture_urls", "no user, query or fragment"),
    ({"hidden_states": "online", "capture_urls": [f"http://h:{8000 + i}" for i in range(17)]}, "capture_urls",
     "lists 17 URLs; at most 16"),
    ({"hidden_states": "online", "capture_servers": 0}, "capture_servers",
     "capture_servers 0 starts no capture server"),
    ({"hidden_states": "online", "capture_servers": 17}, "capture_servers", "between 0 and 16, got 17"),
    ({"hidden_states_cache_gib": 0}, "hidden_states_cache_gib", "more than 0"),
    ({"hidden_states_cache_gib": -1.0}, "hidden_states_cache_gib", "more than 0"),
    ({"capture_urls": ["http://10.0.0.1:8000"]}, "capture_urls", "asked only by an online run"),
])
def test_run_config_refuses_naming_the_field(config, field, words):
    with pytest.raises(RunConfigError) as caught:
        RunConfig(**config)
    assert caught.value.field == field and words in str(caught.value), str(caught.value)


def test_run_config_keeps_the_urls_without_a_trailing_slash():
    config = RunConfig(hidden_states="online", capture_urls=["http://10.0.0.7:8000/", " http://10.0.0.8:8001 "])
    assert config.capture_urls == ["http://10.0.0.7:8000", "http://10.0.0.8:8001"]
    defaults = RunConfig().as_dict()
    assert {key: defaults[key] for key in ("hidden_states", "capture_urls", "capture_servers",
                                           "hidden_states_cache_gib")} == {
        "hidden_states": "offline", "capture_urls": [], "capture_servers": 1, "hidden_states_cache_gib": 20.0}


def test_an_online_launch_through_the_api_the_form_and_the_cli_is_one_run(people, api, roots):
    response = api("launcher").post("/api/v1/runs/", body(roots, **ONLINE))
    assert response.status_code == 201, response.json()
    by_api = PipelineRun.objects.get(pk=response.json()["id"])
    assert {k: by_api.config[k] for k in ONLINE} == ONLINE

    browser = Client()
    browser.force_login(people["launcher"][0])
    form = {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "draft_vocab_size": 64,
            "hidden_states": "online", "capture_servers": 0, "capture_urls": "http://10.0.0.7:8000\nhttps://10.0.0.9:9443",
            "hidden_states_cache_gib": 2.5, "max_seq_len": 512, "epochs": 2, "lr": 3e-4, "ttt_steps": 3}
    assert browser.post("/runs/new/", form).status_code == 302
    by_form = PipelineRun.objects.exclude(pk=by_api.pk).get()

    out = io.StringIO()
    call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                 "--draft-vocab-size", "64", "--hidden-states", "online", "--capture-servers", "0",
                 "--capture-url", "http://10.0.0.7:8000", "--capture-url", "https://10.0.0.9:9443",
                 "--hidden-states-cache-gib", "2.5", "--user", people["launcher"][0].username, "--json", stdout=out)
    by_cli = PipelineRun.objects.get(pk=json.loads(out.getvalue())["run_id"])
    assert by_api.config == by_form.config == by_cli.config
    # Capture URLs alone: no vLLM on the trainer's worker, so its training goes where an offline run's does.
    assert stage_queue(stage_name="train", config=by_api.config) == "gpu"
    # "Launch a copy" fills the form's box with the URLs, one a line.
    assert launch_copy_initial(run_id=str(by_api.pk), user=by_api.owner)["capture_urls"] == "http://10.0.0.7:8000\nhttps://10.0.0.9:9443"


@pytest.mark.parametrize(("over", "field", "words"), [
    ({"capture_urls": ["ftp://h:21"]}, "capture_urls", "URL 1 'ftp://h:21' must start with http:// or https://"),
    ({"capture_urls": ["http://h:1 http://g:2"]}, "capture_urls", "one URL, without spaces"),
    ({"capture_urls": []}, "capture_servers", "capture_servers 0 starts no capture server"),
    ({"hidden_states_cache_gib": 0}, "hidden_states_cache_gib", "greater than or equal to 0.001"),
    ({"capture_servers": 17}, "capture_servers", "less than or equal to 16"),
])
def test_the_api_refuses_bad_online_settings_naming_the_field_and_stores_nothing(api, roots, over, field, words):
    before = stored()
    response = api("launcher").post("/api/v1/runs/", body(roots, **{**ONLINE, **over}))
    assert response.status_code == 400
    assert words in response.json()["fields"][field], response.json()
    assert stored() == before


def test_the_form_shows_the_error_under_the_field_in_its_words(people, roots):
    browser = Client()
    browser.force_login(people["launcher"][0])
    response = browser.post("/runs/new/", {
        "target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "draft_vocab_size": 64,
        "max_seq_len": 512, "epochs": 2, "lr": 3e-4, "ttt_steps": 3, "hidden_states": "online",
        "capture_servers": 0, "capture_urls": "http://10.0.0.7:8000\nhttp://bad host:1"})
    assert response.status_code == 400
    assert response.context["form"].errors["capture_urls"] == [
        "URL 2 'http://bad host:1' may not hold spaces or control characters"]
    assert PipelineRun.objects.count() == 0


@pytest.mark.parametrize(("flags", "words"), [
    (["--capture-servers", "0"], "--capture-servers: capture_servers 0 starts no capture server"),
    (["--capture-url", "ftp://h:21"], "--capture-url 1 'ftp://h:21' must start with http:// or https://"),
    (["--capture-url", "http://10.0.0.1:1", "--capture-url", "http://10.0.0.1:1"],
     "--capture-url 2 'http://10.0.0.1:1' is listed twice"),
    (["--hidden-states-cache-gib", "0"], "--hidden-states-cache-gib: hidden_states_cache_gib must be more than 0"),
])
def test_run_pipeline_names_the_flag(people, roots, flags, words):
    before = stored()
    with pytest.raises(CommandError) as caught:
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--hidden-states", "online", *flags, "--user", people["launcher"][0].username)
    assert words in str(caught.value), str(caught.value)
    assert stored() == before


def test_capture_servers_need_a_live_worker_with_vllm(people, roots):
    cpu_worker(probe_queues=False)  # takes cpu and gpu only: no vLLM queue
    user = people["launcher"][0]
    started = {**ONLINE, "capture_servers": 2, "capture_urls": []}
    from runs.pipeline import services

    before = stored()
    with pytest.raises(RunConfigError) as caught:
        services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                            config=RunConfig(draft_vocab_size=64, **started))
    assert caught.value.field == "capture_servers"
    assert "goes to queue vllm.1, which no live worker takes" in str(caught.value)
    assert stored() == before

    fake_gpu_worker()  # FAKE: a GPU host with vLLM, taking vllm.1 among its queues
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64, **started))
    assert stage_queue(stage_name="train", config=run.config) == "vllm.1"
    assert stage_queue(stage_name="extract", config=run.config) == "gpu"  # it writes nothing, anywhere
