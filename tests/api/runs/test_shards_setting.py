"""The run's `shards` setting (issue 36) wherever a launch is made (API, run_pipeline, the client), refused
naming the field when it is not a whole number from 1, with nothing stored (the client's --shards:
tests/client/test_cli_shards.py); and a stage's shards as the
run summary (API detail, `run_pipeline --json`), the run page and the Workers page show them."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from runs.fleet.models import Worker
from runs.models import ExtractStage, PendingEnqueue, PipelineRun, StageShard, StageStatus
from runs.pipeline import selectors, services
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db


def stored() -> tuple[int, int]:
    return PipelineRun.objects.count(), PendingEnqueue.objects.count()


def body(roots, **extra) -> dict:
    return {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "draft_vocab_size": 64, **extra}


@pytest.mark.parametrize("value", [0, -2, "two", 1025, 1.5])
def test_the_api_refuses_shards_that_are_not_a_whole_number_from_1_naming_the_field(api, roots, value):
    before = stored()
    response = api("launcher").post("/api/v1/runs/", body(roots, shards=value))
    assert response.status_code == 400, response.json()
    assert "shards" in response.json()["fields"]
    assert stored() == before


def test_the_api_stores_shards_and_leaves_them_to_the_fleet_when_omitted(api, roots):
    response = api("launcher").post("/api/v1/runs/", body(roots, shards=3))
    assert response.status_code == 201, response.json()
    assert PipelineRun.objects.get(pk=response.json()["id"]).config["shards"] == 3
    response = api("launcher").post("/api/v1/runs/", body(roots))
    assert PipelineRun.objects.get(pk=response.json()["id"]).config["shards"] is None
    detail = api("launcher").get(f"/api/v1/runs/{response.json()['id']}/").json()
    assert [stage["shards"] for stage in detail["stages"]] == [[]] * 5  # nothing split yet


def test_run_pipeline_refuses_shards_0_naming_the_flag(people, roots):
    before = stored()
    with pytest.raises(CommandError, match=r"--shards: shards must be a whole number from 1 to 1024 \(or left out\), "
                                           "got 0"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--draft-vocab-size", "64", "--shards", "0", "--user", people["launcher"][0].username)
    assert stored() == before


@pytest.fixture
def split_run(people, roots, django_capture_on_commit_callbacks):
    """A run whose extraction is split in two: shard 0 done by a@host1, shard 1 running on b@host2."""
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=people["launcher"][0], target_path=roots / "target",
                                  dataset_path=roots / "chats.jsonl", config=RunConfig(draft_vocab_size=64, shards=2))
    stage = ExtractStage.objects.get(run=run)
    now = timezone.now()
    StageShard.objects.create(run=run, stage="extract", record_id=stage.pk, index=0, row_start=0, row_stop=64,
                              status=StageStatus.SUCCEEDED, worker="a@host1", attempts=1, rows_done=64,
                              started_at=now - timedelta(seconds=32), finished_at=now)
    StageShard.objects.create(run=run, stage="extract", record_id=stage.pk, index=1, row_start=64, row_stop=128,
                              status=StageStatus.RUNNING, worker="b@host2", attempts=2, rows_done=10,
                              started_at=now - timedelta(seconds=5), lease_expires_at=now + timedelta(seconds=30))
    return run


def test_the_summary_carries_each_stages_shards(split_run):
    summary = run_summary(selectors.run_list().get(pk=split_run.pk))
    extract = next(s for s in summary["stages"] if s["name"] == "extract")
    assert [{k: s[k] for k in ("index", "rows", "worker", "state", "attempts")} for s in extract["shards"]] == [
        {"index": 0, "rows": [0, 64], "worker": "a@host1", "state": "succeeded", "attempts": 1},
        {"index": 1, "rows": [64, 128], "worker": "b@host2", "state": "running", "attempts": 2}]
    assert extract["shards"][0]["rows_per_second"] == pytest.approx(2.0, rel=0.05)  # 64 rows in 32 s
    assert extract["shards"][1]["span"] == "rows 64–127"
    assert all(s["shards"] == [] for s in summary["stages"] if s["name"] != "extract")


def test_the_run_page_lists_the_shards_and_the_workers_page_names_the_one_held(split_run, client, people):
    client.force_login(people["launcher"][0])
    page = client.get(reverse("runs:run_detail", args=[split_run.pk])).content.decode()
    assert 'data-stage-shards="extract"' in page and "rows 64–127" in page and "b@host2" in page
    Worker.objects.create(name="b@host2", hostname="host2", capabilities={}, queues=["gpu"],
                          started_at=timezone.now(), last_seen=timezone.now())
    page = client.get(reverse("runs:worker_list")).content.decode()
    row = page[page.index('data-worker="b@host2"'):]
    row = row[:row.index("</tr>")]
    assert 'data-status="busy"' in row and "extract hidden states, shard 1 (rows 64–127)" in row
