"""/api/v1/runs/: the list as the runs page filters, sorts and pages it; a run's summary; launching
through the launch form's checks (the same run as the form, refused where the form refuses, nothing
stored then); cancel, retry, tags, copy; stages, attempts and curves; JSON 404s and 405s."""
from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection
from django.test import Client

from runs.models import PipelineRun, StageAttempt
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.runs_list import run_table
from runs.tracking.services import metrics_record

pytestmark = pytest.mark.django_db


def counts() -> dict:
    """Rows of every table of the app but the audit trail (which records refused requests too)."""
    tables = [m._meta.db_table for m in apps.get_app_config("runs").get_models() if m.__name__ != "ApiAuditEntry"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f'(SELECT count(*) FROM "{t}")' for t in tables))
        return dict(zip(tables, cursor.fetchone()))


def body(roots, **over) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), **over}


def launched(people, roots, role="launcher", name="", **config) -> PipelineRun:
    return services.run_launch(user=people[role][0], target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(**{"draft_vocab_size": 64, **config}), name=name)


def test_a_launch_through_the_api_is_the_run_the_form_launches(people, api, roots):
    settings = {"name": "same", "layer_ids": [2, 5], "max_seq_len": 256, "max_samples": 40, "draft_vocab_size": 128,
                "epochs": 3, "lr": 0.001, "ttt_steps": 2, "val_fraction": 0.2, "seed": 7, "eval_prompts": 4,
                "eval_max_new_tokens": 16, "max_tokens_per_step": 1024}
    response = api("launcher").post("/api/v1/runs/", body(roots, **settings))
    assert response.status_code == 201
    assert response["Location"].endswith(f"/api/v1/runs/{response.json()['id']}/")
    by_api = PipelineRun.objects.get(pk=response.json()["id"])
    browser = Client()
    browser.force_login(people["launcher"][0])
    form = {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "layer_ids": "2, 5",
            **{k: v for k, v in settings.items() if k != "layer_ids"}}
    assert browser.post("/runs/new/", form).status_code == 302
    by_form = PipelineRun.objects.exclude(pk=by_api.pk).get()
    assert by_api.config == by_form.config
    assert by_api.config["layer_ids"] == [2, 5, 8]  # the final hidden state is always captured last
    assert (by_api.name, by_api.owner, by_api.target, by_api.dataset) == (
        by_form.name, by_form.owner, by_form.target, by_form.dataset)
    assert (by_api.training_run.epochs, by_api.training_run.lr, by_api.extract_stage.layer_ids) == (3, 0.001, [2, 5, 8])
    assert response.json()["config"] == by_api.config and response.json()["status"] == "queued"


def test_omitted_settings_take_run_pipelines_defaults(api, roots):
    run = PipelineRun.objects.get(pk=api("launcher").post("/api/v1/runs/", body(roots)).json()["id"])
    assert run.config == {**RunConfig().as_dict(), "layer_ids": [2, 4, 5, 8],  # EAGLE-3's [2, N//2, N-3] + N
                          "vllm_check": "skipped: turned off (EAGLE3WEB_VLLM_PREFLIGHT_SECONDS=0)"}


@pytest.mark.parametrize("change, field, words", [
    ({"epochs": 0}, "epochs", "greater than or equal to 1"),
    ({"layer_ids": "2,4"}, "layer_ids", "list"),
    ({"layer_ids": [2, 99]}, "layer_ids", "99"),
    ({"lr": "fast"}, "lr", "number"),
    ({"lr": 0.9}, "lr", "less than or equal to 0.5"),
    ({"target": None}, "target", "null"),
    ({"target": "/etc"}, "target", "EAGLE3WEB_DATA_ROOTS"),
    ({"dataset": "missing.jsonl"}, "dataset", "missing.jsonl"),
    ({"draft_vocab_size": 6000}, "draft_vocab_size", "larger than the target's vocabulary (5000)"),
    ({"training_backend": "deepspeed"}, "training_backend", "deepspeed"),
    ({"epoch": 2}, "epoch", "unknown field 'epoch'"),
    # A run trained elsewhere (tests/api/external/test_external_runs.py) has its own body: the trainer's settings.
    ({"external": True, "name": "x"}, "config", "required"),
])
def test_bad_launch_input_is_a_400_naming_the_field_and_nothing_is_stored(api, roots, change, field, words):
    before = counts()
    response = api("launcher").post("/api/v1/runs/", body(roots, **change))
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == [field]
    assert words in response.json()["fields"][field]
    assert counts() == before


def test_a_body_that_is_not_a_json_object_is_a_400(api):
    client = api("launcher")
    assert client.post("/api/v1/runs/", [1, 2]).json()["error"] == "the body must be a JSON object, got list"
    raw = client.client.post("/api/v1/runs/", "{not json", content_type="application/json",
                             HTTP_AUTHORIZATION=client.header)
    assert raw.status_code == 400 and "JSON parse error" in raw.json()["error"]
    form = client.client.post("/api/v1/runs/", {"target": "x"}, HTTP_AUTHORIZATION=client.header)
    assert form.status_code == 415 and "multipart/form-data" in form.json()["error"]


def test_the_list_filters_sorts_and_pages_as_the_runs_page(people, api, roots, monkeypatch):
    monkeypatch.setattr(run_table, "PAGE_SIZE", 2)
    a = launched(people, roots, name="alpha")
    b = launched(people, roots, name="beta")
    c = launched(people, roots, role="admin", name="gamma")
    services.run_cancel(run=b, user=people["launcher"][0])
    client = api("viewer")
    first = client.get("/api/v1/runs/").json()
    assert (first["count"], first["pages"], first["page_size"], first["previous"]) == (3, 2, 2, None)
    assert [r["id"] for r in first["results"]] == [c.pk, b.pk]  # newest first
    second = client.get(first["next"].split("testserver")[1]).json()
    assert [r["id"] for r in second["results"]] == [a.pk] and second["next"] is None
    assert [r["name"] for r in client.get("/api/v1/runs/", {"sort": "name"}).json()["results"]] == ["alpha", "beta"]
    assert [r["id"] for r in client.get("/api/v1/runs/", {"owner": "api-admin"}).json()["results"]] == [c.pk]
    assert [r["id"] for r in client.get("/api/v1/runs/", {"status": "cancelled"}).json()["results"]] == [b.pk]
    row = client.get("/api/v1/runs/", {"q": "gamma"}).json()["results"][0]
    assert {k: row[k] for k in ("name", "status", "owner", "target", "dataset", "epochs", "tags")} == {
        "name": "gamma", "status": "queued", "owner": "api-admin", "target": "target", "dataset": "chats.jsonl",
        "epochs": 2, "tags": []}


@pytest.mark.parametrize("query, field", [({"sort": "colour"}, "sort"), ({"status": "done"}, "status"),
                                          ({"page": "0"}, "page"), ({"owners": "x"}, "owners")])
def test_a_bad_list_parameter_is_a_400_naming_it(api, query, field):
    response = api("viewer").get("/api/v1/runs/", query)
    assert response.status_code == 400 and list(response.json()["fields"]) == [field]


def test_a_run_is_its_summary_with_its_id_and_tags(people, api, roots):
    run = launched(people, roots, name="seen")
    api("launcher").post(f"/api/v1/runs/{run.pk}/tags/", {"tags": ["baseline", "fp8"]})
    answer = api("viewer").get(f"/api/v1/runs/{run.pk}/").json()
    assert (answer["id"], answer["run_id"], answer["name"], answer["owner"]) == (run.pk, run.pk, "seen", "api-launcher")
    assert [s["name"] for s in answer["stages"]] == ["prepare", "extract", "vocab", "train", "evaluate"]
    assert answer["tags"] == ["baseline", "fp8"] and answer["config"]["draft_vocab_size"] == 64


def test_missing_runs_and_paths_are_json_404s_and_wrong_methods_json_405s(people, api, roots):
    client = api("viewer")
    for url in ("/api/v1/runs/999999/", f"/api/v1/runs/{2**70}/", "/api/v1/runs/999999/stages/",
                "/api/v1/runs/999999/metrics/", "/api/v1/no-such-thing/"):
        response = client.get(url)
        assert response.status_code == 404 and response["Content-Type"] == "application/json", url
        assert set(response.json()) == {"error", "fields"}
    assert "with the slash" in client.get("/api/v1/runs").json()["error"]
    run = launched(people, roots)
    for method, url, allowed in (("DELETE", f"/api/v1/runs/{run.pk}/", "GET"), ("PUT", "/api/v1/runs/", "GET, POST"),
                                 ("GET", f"/api/v1/runs/{run.pk}/cancel/", "POST")):
        response = client.call(method, url)
        assert response.status_code == 405
        assert response.json()["error"] == f"{method} is not allowed here; allowed: {allowed}"


def test_the_owner_cancels_and_retries_through_the_api(people, api, roots):
    run = launched(people, roots)
    client = api("launcher")
    assert client.post(f"/api/v1/runs/{run.pk}/cancel/").json() == {"id": run.pk, "cancelled": 5}
    assert client.get(f"/api/v1/runs/{run.pk}/").json()["status"] == "cancelled"
    assert client.post(f"/api/v1/runs/{run.pk}/retry/").json() == {"id": run.pk, "queued": 5}
    assert client.post(f"/api/v1/runs/{run.pk}/retry/").json() == {"id": run.pk, "queued": 0}


def test_tags_replace_the_runs_tags_and_a_comma_is_refused(people, api, roots):
    run = launched(people, roots)
    client = api("launcher")
    assert client.post(f"/api/v1/runs/{run.pk}/tags/", {"tags": ["a", " a ", "b"]}).json()["tags"] == ["a", "b"]
    refused = client.post(f"/api/v1/runs/{run.pk}/tags/", {"tags": ["x, y"]})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["tags"]
    assert client.post(f"/api/v1/runs/{run.pk}/tags/", {"tags": "a"}).json()["fields"]["tags"].startswith(
        'Expected a list')
    assert sorted(run.tags.values_list("name", flat=True)) == ["a", "b"]
    assert client.post(f"/api/v1/runs/{run.pk}/tags/", {"tags": []}).json()["tags"] == []


def test_a_copy_launches_the_runs_settings_with_the_bodys_changes(people, api, roots):
    run = launched(people, roots, role="admin", epochs=1, seed=3, name="original")
    response = api("launcher").post(f"/api/v1/runs/{run.pk}/copy/", {"epochs": 4})
    assert response.status_code == 201
    copy = PipelineRun.objects.get(pk=response.json()["id"])
    assert copy.owner == people["launcher"][0] and copy.name == "copy of original"
    assert copy.config == {**run.config, "epochs": 4}
    assert api("launcher").post("/api/v1/runs/999999/copy/").status_code == 404
    refused = api("launcher").post(f"/api/v1/runs/{run.pk}/copy/", {"seed": -1})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["seed"]


def test_stages_and_attempts(people, api, roots):
    run = launched(people, roots)
    StageAttempt.objects.create(run=run, stage="prepare", record_id=run.preparation.pk, number=1, worker="w1",
                                started_at=run.created_at, outcome="lost", error="worker w1 went away")
    stages = api("viewer").get(f"/api/v1/runs/{run.pk}/stages/").json()
    assert [(s["name"], s["status"]) for s in stages["stages"]] == [
        ("prepare", "queued"), ("extract", "queued"), ("vocab", "queued"), ("train", "queued"), ("evaluate", "queued")]
    attempts = api("viewer").get(f"/api/v1/runs/{run.pk}/attempts/").json()["attempts"]
    assert [(a["stage"], a["number"], a["worker"], a["outcome"]) for a in attempts] == [("prepare", 1, "w1", "lost")]


def test_curves_are_the_windowed_read_and_the_export(people, api, roots):
    run = launched(people, roots)
    metrics_record(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": "loss_0", "step": s, "epoch": s / 10, "value": 1.0 / s} for s in range(1, 11)])
    client = api("viewer")
    window = client.get(f"/api/v1/runs/{run.pk}/metrics/", {"keys": "loss_0", "split": "train", "start": 3,
                                                            "end": 5}).json()
    series = window["series"][0]
    assert (window["run"], series["key"], series["steps"], series["values"]) == (
        run.pk, "loss_0", [3, 4, 5], [1 / 3, 0.25, 0.2])
    export = client.get(f"/api/v1/runs/{run.pk}/metrics/export/", {"key": "loss_0", "split": "train"})
    lines = b"".join(export.streaming_content).decode().splitlines()
    assert lines[0] == "step,epoch,value,time" and lines[1].startswith("1,0.1,1.0,") and len(lines) == 11
    refused = client.get(f"/api/v1/runs/{run.pk}/metrics/", {"points": "2"})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["points"]
    refused = client.get(f"/api/v1/runs/{run.pk}/metrics/", {"after": "3"})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["after"]
