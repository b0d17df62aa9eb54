"""/api/v1/ for what runs use and make: checkpoints and their acceptance measurements, extractions
(import, verify), datasets (import, catalogue, regenerate), targets, workers, who is asking, and the
API's own description (openapi.json and its page)."""
from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from runs.models import (Checkpoint, Dataset, DatasetCatalogue, DatasetRegeneration, Evaluation, Extraction,
                         VerificationRequest)
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from tests.api.runs.test_api_runs import counts

pytestmark = pytest.mark.django_db


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    chat = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    path.write_text(json.dumps(chat) + "\n")
    return path


@pytest.fixture
def checkpoint(people, config_only_target, chats, tmp_path):
    run = services.run_launch(user=people["launcher"][0], target_path=config_only_target, dataset_path=chats,
                              config=RunConfig(draft_vocab_size=64))
    return Checkpoint.objects.create(training_run=run.training_run, epoch=1, path=str(tmp_path / "ckpt-1"),
                                     val_loss=2.5, train_loss=3.0)


def test_a_checkpoint_and_measuring_its_acceptance(checkpoint, api):
    got = api("viewer").get(f"/api/v1/checkpoints/{checkpoint.pk}/").json()
    assert (got["id"], got["epoch"], got["val_loss"], got["run"], got["evaluations"]) == (
        checkpoint.pk, 1, 2.5, checkpoint.training_run.run_id, [])
    queued = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/", {"max_prompts": 4})
    assert queued.status_code == 202 and queued.json()["created"] is True
    evaluation = Evaluation.objects.get(pk=queued.json()["evaluation"]["id"])
    assert (evaluation.checkpoint, evaluation.max_prompts, evaluation.max_new_tokens) == (checkpoint, 4, 64)
    again = api("admin").post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/", {"max_prompts": 4})
    assert again.status_code == 200 and again.json() == {**queued.json(), "created": False}
    assert api("viewer").post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/").status_code == 403
    before = counts()
    refused = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/", {"max_prompts": 0})
    assert refused.status_code == 400 and "max_prompts must be between 1" in refused.json()["error"]
    refused = api("launcher").post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/", {"prompts": "/etc/passwd"})
    assert refused.status_code == 400 and refused.json()["fields"] == {}
    assert counts() == before
    assert [e["id"] for e in api("viewer").get(f"/api/v1/checkpoints/{checkpoint.pk}/").json()["evaluations"]] == [
        evaluation.pk]


def test_extractions_imported_listed_read_and_verified(api, config_only_target, tmp_path):
    from tests.contract.test_verify import write_flat

    directory = write_flat(tmp_path / "ext")
    made = api("launcher").post("/api/v1/extractions/", {"path": str(directory), "target": str(config_only_target)})
    assert made.status_code == 201
    extraction = Extraction.objects.get(pk=made.json()["id"])
    assert (made.json()["layout"], made.json()["layer_ids"], made.json()["total_tokens"]) == ("flat_v1", [2, 4, 5, 7], 24)
    assert VerificationRequest.objects.filter(extraction=extraction).count() == 1  # headers checked by a worker
    again = api("launcher").post("/api/v1/extractions/", {"path": str(directory), "target": str(config_only_target)})
    assert again.status_code == 200 and again.json()["id"] == extraction.pk
    listed = api("viewer").get("/api/v1/extractions/").json()
    assert listed["count"] == 1 and listed["results"][0]["imported_by"] == "api-launcher"
    assert api("viewer").get(f"/api/v1/extractions/{extraction.pk}/").json()["directory"] == str(directory)
    verify = api("reviewer").post(f"/api/v1/extractions/{extraction.pk}/verify/", {"full": True})
    assert verify.status_code == 202
    assert VerificationRequest.objects.get(pk=verify.json()["verification_request"]["id"]).full is True
    assert api("viewer").post(f"/api/v1/extractions/{extraction.pk}/verify/").status_code == 403
    before = counts()
    refused = api("launcher").post("/api/v1/extractions/", {"path": str(tmp_path / "nothing-here")})
    assert refused.status_code == 400 and "nothing-here" in refused.json()["error"]
    assert api("launcher").post("/api/v1/extractions/", {}).json()["fields"] == {"path": "This field is required."}
    assert counts() == before


def test_datasets_imported_listed_read_catalogued_and_regenerated(api, chats, config_only_target):
    made = api("launcher").post("/api/v1/datasets/", {"path": str(chats)})
    assert made.status_code == 200
    dataset = Dataset.objects.get(pk=made.json()["id"])
    assert (dataset.path, made.json()["name"], made.json()["size_bytes"]) == (str(chats), "chats.jsonl", chats.stat().st_size)
    assert DatasetCatalogue.objects.filter(dataset=dataset).count() == 1
    assert api("viewer").post("/api/v1/datasets/", {"path": str(chats)}).status_code == 403
    assert api("viewer").get("/api/v1/datasets/").json()["results"][0]["id"] == dataset.pk
    detail = api("viewer").get(f"/api/v1/datasets/{dataset.pk}/").json()
    assert (detail["samples"], detail["regenerated_from"], len(detail["catalogues"])) == (0, None, 1)
    assert api("launcher").post(f"/api/v1/datasets/{dataset.pk}/catalogue/").status_code == 202
    assert DatasetCatalogue.objects.filter(dataset=dataset, status="queued").count() == 1  # the queued one reused
    target = services.target_register(path=config_only_target)
    before = counts()
    refused = api("launcher").post(f"/api/v1/datasets/{dataset.pk}/regenerate/", {"target": target.pk})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["target"]  # no tokenizer to chat with
    refused = api("launcher").post(f"/api/v1/datasets/{dataset.pk}/regenerate/", {"target": target.pk,
                                                                                  "temperature": -1})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["temperature"]
    refused = api("launcher").post(f"/api/v1/datasets/{dataset.pk}/regenerate/", {"target": target.pk, "shards": 0})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["shards"]
    assert counts() == before and DatasetRegeneration.objects.count() == 0


def test_targets_workers_and_who_is_asking(api, config_only_target):
    target = services.target_register(path=config_only_target)
    listed = api("viewer").get("/api/v1/targets/").json()["results"]
    assert [(t["id"], t["num_layers"], t["default_layer_ids"]) for t in listed] == [(target.pk, 8, [2, 4, 5, 8])]
    workers = api("viewer").get("/api/v1/workers/").json()
    assert {"workers", "launch_options", "queue", "refused_by_broker", "waiting_for_retry"} <= set(workers)
    assert workers["workers"] == [] and set(workers["launch_options"]) == {
        "transformers", "vllm", "eagle3web", "speculators"}
    assert api("reviewer").get("/api/v1/me/").json()["roles"] == ["reviewer"]


def test_the_openapi_document_describes_every_endpoint_and_its_body(api):
    schema = api("viewer").get("/api/v1/openapi.json").json()
    assert schema["openapi"].startswith("3.") and schema["info"]["title"] == "eagle3web API"
    paths = schema["paths"]
    assert sorted(paths) == sorted([
        "/api/v1/runs/", "/api/v1/runs/{id}/", "/api/v1/runs/{id}/cancel/", "/api/v1/runs/{id}/retry/",
        "/api/v1/runs/{id}/tags/", "/api/v1/runs/{id}/copy/", "/api/v1/runs/{id}/stages/",
        "/api/v1/runs/{id}/attempts/", "/api/v1/runs/{id}/metrics/", "/api/v1/runs/{id}/metrics/export/",
        "/api/v1/runs/{id}/checkpoints/", "/api/v1/runs/{id}/end/", "/api/v1/runs/{id}/keep-cache/",
        "/api/v1/checkpoints/{id}/", "/api/v1/checkpoints/{id}/evaluate/", "/api/v1/extractions/",
        "/api/v1/extractions/{id}/", "/api/v1/extractions/{id}/verify/", "/api/v1/datasets/", "/api/v1/datasets/{id}/",
        "/api/v1/datasets/{id}/catalogue/", "/api/v1/datasets/{id}/regenerate/", "/api/v1/targets/",
        "/api/v1/workers/", "/api/v1/me/",
        # What the pages poll with their session (the cookie-only /api/runs/... they read before is gone).
        "/api/v1/runs/{id}/status/", "/api/v1/targets/inspect/", "/api/v1/sweeps/{id}/",
        # A measurement's replies, projects and their members, saved views, reports and alert rules.
        "/api/v1/checkpoints/{id}/generations/", "/api/v1/checkpoints/{id}/export/", "/api/v1/projects/", "/api/v1/projects/{id}/members/",
        "/api/v1/projects/{id}/members/{username}/", "/api/v1/saved-views/", "/api/v1/reports/",
        "/api/v1/reports/{id}/", "/api/v1/alert-rules/", "/api/v1/alert-rules/{id}/", "/api/v1/alerts/",
        "/api/v1/alerts/read/",
        # What compare's baseline select asks.
        "/api/v1/compare/acceptance/"])
    assert set(paths["/api/v1/alert-rules/{id}/"]) == {"delete"}
    assert set(paths["/api/v1/reports/"]) == set(paths["/api/v1/projects/"]) == {"get", "post"}
    assert set(paths["/api/v1/runs/"]) == {"get", "post"}
    assert set(paths["/api/v1/runs/{id}/metrics/"]) == {"get", "post"}
    # A launch, or a run trained elsewhere (runs.api.views.external).
    assert paths["/api/v1/runs/"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {"oneOf": [
        {"$ref": "#/components/schemas/LaunchBody"}, {"$ref": "#/components/schemas/ExternalRunBody"}]}
    assert schema["components"]["schemas"]["ExternalRunBody"]["required"] == ["external", "name", "config"]
    assert schema["components"]["schemas"]["PointsBody"]["required"] == ["points"]
    assert set(paths["/api/v1/runs/{id}/metrics/"]["post"]["responses"]) >= {"200", "400", "403", "404", "409"}
    launch = schema["components"]["schemas"]["LaunchBody"]
    assert launch["required"] == ["target", "dataset"]
    assert launch["properties"]["layer_ids"] == {"type": "array", "items": {"type": "integer"},
                                                 "description": "hidden-state ids to capture; [] or omitted: "
                                                                "EAGLE-3's default"}
    assert {p["name"] for p in paths["/api/v1/runs/"]["get"]["parameters"]} == {
        "q", "status", "target", "dataset", "owner", "tag", "sort", "page",
        # The runs list's filters and columns (runs.tracking.runs_list.run_filters.RunFilters), as the page takes them.
        "project", "sweep", "tau_min", "tau_max", "archived", "settings", "columns"}
    assert paths["/api/v1/runs/{id}/cancel/"]["post"]["responses"]["403"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"error", "fields"}


def test_the_api_page_lists_paths_methods_parameters_and_bodies(people):
    client = Client()
    client.force_login(people["viewer"][0])
    page = client.get("/api/v1/")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert "<code>POST /api/v1/runs/</code>" in html and "<code>layer_ids</code>" in html
    assert "list of integer" in html and "<code>sort</code>" in html
    # Closed clusters: every script and style comes from our own static files (the CSRF token's random
    # letters may spell "cdn", so look at what the page loads, not at its text).
    assert re.findall(r'(?:src|href)="((?:https?:)?//[^"]*)"', html) == []
    assert Client().get("/api/v1/").status_code == 302  # a page: the login page first
