"""The reproductions of issue 34's project findings (3, 4, 5, 6 and 8), each as the probe made it: a
launcher, viewer or reviewer of one closed project against a run of another. Each failed before the one
rule (runs.projects.access) answered them; tests/views/projects/test_project_wall.py walks every route the same way."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from runs.alerts import events
from runs.alerts.models import Alert
from runs.alerts.services import RuleInput, rule_create
from runs.api.tokens import token_create
from runs.fleet.services import worker_heartbeat
from runs.models import AlertRule, PipelineRun, Preparation, Review
from runs.pipeline import services
from runs.pipeline.jobs.models import DatasetRegeneration
from runs.pipeline.launch.run_config import RunConfig
from runs.projects.services import project_create

pytestmark = pytest.mark.django_db


def _person(name: str, *roles: str):
    account = get_user_model().objects.create_user(name)
    for role in roles:
        account.groups.add(Group.objects.get_or_create(name=role)[0])
    return account


@pytest.fixture
def two(roots):
    """Ann's closed project "alpha" and Bob's "beta", a run in each; the reviewer and viewer are alpha's."""
    ann, bob = _person("ann", "launcher"), _person("bob", "launcher")
    project_create(user=ann, name="alpha")
    project_create(user=bob, name="beta")
    launch = dict(target_path=roots / "target", dataset_path=roots / "chats.jsonl", config=RunConfig(), enqueue=False)
    mine = services.run_launch(user=ann, name="ann's run", project="alpha", **launch)
    theirs = services.run_launch(user=bob, name="bob secret run", project="beta", **launch)
    return {"ann": ann, "bob": bob, "mine": mine, "theirs": theirs}


def _api(user):
    from django.test import Client

    return Client(HTTP_AUTHORIZATION=f"Bearer {token_create(user=user, name='probe')[1]}")


def test_copying_another_projects_run_answers_as_no_such_run(two, client):
    api = _api(two["ann"])
    runs = PipelineRun.objects.count()
    hidden = api.post(f"/api/v1/runs/{two['theirs'].pk}/copy/", "{}", content_type="application/json")
    missing = api.post("/api/v1/runs/987654321/copy/", "{}", content_type="application/json")
    assert (hidden.status_code, missing.status_code) == (404, 404)
    assert hidden.json()["error"] == f"no run {two['theirs'].pk} to copy"
    assert "bob secret run" not in hidden.content.decode() and PipelineRun.objects.count() == runs
    client.force_login(two["ann"])
    for query in ("", "&more_data=1"):
        page = client.get(f"/runs/new/?copy={two['theirs'].pk}{query}", follow=True).content.decode()
        assert f"There is no run &#x27;{two['theirs'].pk}&#x27; to copy." in page and "bob secret run" not in page


def test_a_review_of_another_projects_run_or_checkpoint_is_404_and_not_stored(two, client, tmp_path):
    from runs.models import Checkpoint

    checkpoint = Checkpoint.objects.create(training_run=two["theirs"].training_run, epoch=0, path=str(tmp_path / "c"))
    reviewer = _person("rita", "reviewer")
    client.force_login(reviewer)
    assert client.get(f"/runs/{two['theirs'].pk}/").status_code == 404
    for url in (f"/reviews/run/{two['theirs'].pk}/", f"/reviews/checkpoint/{checkpoint.pk}/"):
        assert client.post(url, {"decision": "approve", "text": "fine"}).status_code == 404, url
    assert not Review.objects.exists()


def test_an_alert_rule_cannot_take_another_projects_run_as_its_baseline(two):
    api = _api(two["ann"])
    body = {"event": "tau_below", "baseline_run": two["theirs"].pk}
    hidden = api.post("/api/v1/alert-rules/", json.dumps(body), content_type="application/json")
    missing = api.post("/api/v1/alert-rules/", json.dumps({**body, "baseline_run": 987654321}),
                       content_type="application/json")
    assert (hidden.status_code, missing.status_code) == (400, 400)
    assert hidden.json()["error"].replace(str(two["theirs"].pk), "N") == missing.json()["error"].replace("987654321", "N")
    assert hidden.json()["fields"] == {"baseline_run": hidden.json()["error"]}
    assert not AlertRule.objects.exists()


def test_an_alert_does_not_quote_a_baseline_its_owner_no_longer_sees(two):
    """A rule made while the baseline was visible fires against it; once staff moved the run to a project its
    owner does not see, it is compared with as little as a deleted one: no alert, no name, no τ."""
    from runs.models import TrainingRun

    rule = rule_create(user=two["ann"], data=RuleInput(event="tau_below", baseline_run=two["mine"].pk))
    TrainingRun.objects.filter(run=two["mine"]).update(best_tau=3.0)
    launch = dict(target_path=two["mine"].target.path, dataset_path=two["mine"].dataset.path, config=RunConfig(),
                  enqueue=False, project="alpha")
    low, lower = (services.run_launch(user=two["ann"], name=name, **launch) for name in ("low", "lower"))
    TrainingRun.objects.filter(run__in=[low, lower]).update(best_tau=1.5)
    assert events.tau_recorded(run_id=low.pk) == 1
    assert "ann's run" in Alert.objects.get(rule=rule).text
    PipelineRun.objects.filter(pk=two["mine"].pk).update(project=two["theirs"].project)  # staff moved it to beta
    assert events.tau_recorded(run_id=lower.pk) == 0
    assert Alert.objects.filter(rule=rule).count() == 1


def test_workers_and_their_queue_name_no_run_of_another_project(two, client):
    worker_heartbeat(name="cpu@probe", hostname="probe", capabilities={"gpus": []}, queues=["cpu"],
                     started_at=timezone.now())
    Preparation.objects.filter(run=two["theirs"]).update(status="running", worker="cpu@probe", started_at=timezone.now())
    viewer = _person("vic", "viewer")
    client.force_login(viewer)
    page = client.get("/workers/").content.decode()
    assert "bob secret run" not in page and f"/runs/{two['theirs'].pk}/" not in page
    doing = _api(viewer).get("/api/v1/workers/").json()["workers"][0]["doing"]
    assert [(d["stage"], d["run_id"], d["run_name"]) for d in doing] == [("prepare", None, "")]
    client.force_login(two["bob"])  # its owner sees what his worker does
    assert "bob secret run" in client.get("/workers/").content.decode()


def test_a_dataset_page_lists_only_the_preparations_of_runs_one_sees(two, client):
    client.force_login(two["ann"])
    page = client.get(f"/datasets/{two['mine'].dataset_id}/").content.decode()
    assert "ann&#x27;s run" in page and "bob secret run" not in page


def test_another_launchers_regeneration_is_not_theirs_to_cancel_or_retry(two, client, roots):
    job = DatasetRegeneration.objects.create(
        source=two["theirs"].dataset, source_path=str(roots / "chats.jsonl"), target=two["theirs"].target,
        backend="transformers", max_new_tokens=16, settings_key="probe", output_path=str(roots / "out.jsonl"),
        requested_by=two["bob"])
    client.force_login(two["ann"])
    refused = client.post(f"/regenerations/{job.pk}/cancel/")
    assert refused.status_code == 403 and b"only the one who asked for it and admins may" in refused.content
    job.refresh_from_db()
    assert job.status == "queued"
    assert client.post(f"/regenerations/{job.pk}/retry/").status_code == 403
    client.force_login(two["bob"])
    assert client.post(f"/regenerations/{job.pk}/cancel/").status_code == 302
    job.refresh_from_db()
    assert job.status == "cancelled"


def test_importing_another_projects_extraction_folder_is_refused_without_naming_it(two, roots):
    """The folder a hidden run's extract stage wrote: not handed back (its id, then a 404), refused at `path`."""
    from runs.models import Extraction

    folder = roots / "bob-extraction"
    folder.mkdir()
    hidden = Extraction.objects.create(target=two["theirs"].target, path=str(folder.resolve()),
                                       produced_by=two["theirs"].extract_stage, layer_ids=[1])
    answer = _api(two["ann"]).post("/api/v1/extractions/", json.dumps({"path": str(folder)}),
                                   content_type="application/json")
    assert answer.status_code == 400 and set(answer.json()["fields"]) == {"path"}
    assert "a run in a project you do not see" in answer.json()["error"]
    assert f"extraction {hidden.pk}" not in answer.json()["error"] and "bob secret run" not in answer.content.decode()
    assert _api(two["bob"]).post("/api/v1/extractions/", json.dumps({"path": str(folder)}),
                                 content_type="application/json").json()["id"] == hidden.pk
