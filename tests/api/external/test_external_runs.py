"""Runs trained elsewhere, as their trainer's client sees them: a real HTTP server (live_server),
http.client and Bearer tokens. Created with the trainer's settings, fed curves (read back through the
windowed curves API), checkpoints and an end; refused where the role, the owner, the input or the run's
state say no, with nothing stored; never queued, never picked up by the reconciler."""
from __future__ import annotations

import json
import shutil
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs.api import tokens
from runs.api.models import ApiAuditEntry
from runs.models import Checkpoint, MetricChunk, MetricSeries, PipelineRun, TrainingRun
from runs.pipeline.lifecycle.stage_services import stages_reconcile
from tests.api.conftest import make_user
from tests.api.security.test_api_live_server import Script

CONFIG = {"epochs": 3, "lr": 0.0003, "ttt_steps": 2, "optimizer": {"name": "adamw", "betas": [0.9, 0.95]},
          "cluster": "slurm-a100"}
BATCH = [{"key": "loss_0", "split": "train", "step": 0, "value": 2.5},
         {"key": "loss_0", "split": "train", "step": 10, "value": 1.75},
         {"key": "loss_0", "split": "train", "step": 20, "value": 1.25, "epoch": 0.5},
         {"key": "loss_0", "split": "val", "step": 20, "value": 1.5}]


@pytest.fixture
def scripts(transactional_db, live_server):
    """A Script per role (admin a superuser) and a second launcher: scripts["launcher"]."""
    users = {"viewer": make_user("ext-viewer", "viewer"), "launcher": make_user("ext-launcher", "launcher"),
             "other_launcher": make_user("ext-launcher-2", "launcher"),
             "admin": make_user("ext-admin", "admin", superuser=True)}
    tokens.auth_failures_clear(client="127.0.0.1")
    made = {role: Script(live_server.url, tokens.token_create(user=user, name=f"{role} trainer")[1])
            for role, user in users.items()}
    yield made
    tokens.auth_failures_clear(client="127.0.0.1")


def _create(script, **over):
    status, run, response = script("POST", "/api/v1/runs/", {"external": True, "name": "llama on slurm",
                                                             "config": CONFIG, **over})
    assert status == 201, run
    return run


def _train_loss(script, run_id: int) -> tuple[list[int], list[float], int]:
    status, answer, _ = script("GET", f"/api/v1/runs/{run_id}/metrics/?keys=loss_0&split=train")
    assert status == 200, answer
    (series,) = answer["series"]
    return series["steps"], series["values"], series["num_points"]


def test_a_launcher_creates_an_external_run_that_is_never_queued(scripts, roots):
    status, pipeline, _ = scripts["launcher"]("POST", "/api/v1/runs/", {
        "target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "epochs": 1, "draft_vocab_size": 64})
    assert status == 201
    run = _create(scripts["launcher"])
    assert (run["external"], run["status"], run["finished"], run["config"]) == (True, "running", False, CONFIG)
    assert [(s["name"], s["status"]) for s in run["stages"]] == [("train", "running")]
    assert (run["target"], run["dataset"], run["waiting_for_queue"]) == (None, None, None)
    row = PipelineRun.objects.get(pk=run["id"])
    assert (row.external, row.owner.username) == (True, "ext-launcher")
    training = TrainingRun.objects.get(run=row)  # the trainer's settings fill the training's columns
    assert (training.epochs, training.lr, training.ttt_steps) == (3, 0.0003, 2)
    status, fleet, _ = scripts["launcher"]("GET", "/api/v1/workers/")
    assert status == 200 and {item["run_id"] for item in fleet["queue"] if item["kind"] != "catalogue"} == {pipeline["id"]}
    # Hours later, with no lease ever renewed: the reconciler leaves it to its client.
    TrainingRun.objects.filter(run=row).update(started_at=timezone.now() - timedelta(days=1))
    assert stages_reconcile() == []
    assert TrainingRun.objects.get(run=row).status == "running"


def test_points_read_back_through_the_windowed_curves_api_as_posted(scripts):
    launcher = scripts["launcher"]
    run = _create(launcher)
    status, counts, _ = launcher("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": BATCH})
    assert (status, counts) == (200, {"accepted": 4, "unchanged": 0, "replaced": 0})
    assert _train_loss(launcher, run["id"]) == ([0, 10, 20], [2.5, 1.75, 1.25], 3)
    status, val, _ = launcher("GET", f"/api/v1/runs/{run['id']}/metrics/?keys=loss_0&split=val")
    assert [(s["steps"], s["values"]) for s in val["series"]] == [([20], [1.5])]
    status, summary, _ = launcher("GET", f"/api/v1/runs/{run['id']}/")
    assert summary["glance"]["latest"]["train"]["loss"] == [1.25]
    assert summary["glance"]["train_step"] == 20


def test_a_batch_sent_twice_is_not_doubled_and_a_changed_value_replaces(scripts):
    launcher = scripts["launcher"]
    run = _create(launcher)
    url = f"/api/v1/runs/{run['id']}/metrics/"
    assert launcher("POST", url, {"points": BATCH})[1] == {"accepted": 4, "unchanged": 0, "replaced": 0}
    assert launcher("POST", url, {"points": BATCH})[1] == {"accepted": 0, "unchanged": 4, "replaced": 0}
    assert _train_loss(launcher, run["id"]) == ([0, 10, 20], [2.5, 1.75, 1.25], 3)
    # A resent batch with one corrected value, one step in a gap and one after the last.
    fix = [{"key": "loss_0", "split": "train", "step": 10, "value": 1.5},
           {"key": "loss_0", "split": "train", "step": 5, "value": 2.0},
           {"key": "loss_0", "split": "train", "step": 20, "value": 1.25, "epoch": 0.5},
           {"key": "loss_0", "split": "train", "step": 30, "value": 1.0}]
    assert launcher("POST", url, {"points": fix})[1] == {"accepted": 2, "unchanged": 1, "replaced": 1}
    assert _train_loss(launcher, run["id"]) == ([0, 5, 10, 20, 30], [2.5, 2.0, 1.5, 1.25, 1.0], 5)
    series = MetricSeries.objects.get(training_run__run_id=run["id"], split="train", key="loss_0")
    assert (series.min_value, series.min_step, series.max_value, series.max_step, series.last_step) == (
        1.0, 30, 2.5, 0, 30)


@pytest.mark.parametrize("point, field", [
    ({"key": "", "split": "train", "step": 1, "value": 1.0}, "points[1].key"),
    ({"key": "k" * 51, "split": "train", "step": 1, "value": 1.0}, "points[1].key"),
    ({"key": "loss_0", "split": "test", "step": 1, "value": 1.0}, "points[1].split"),
    ({"key": "loss_0", "split": "train", "step": -1, "value": 1.0}, "points[1].step"),
    ({"key": "loss_0", "split": "train", "step": 1.5, "value": 1.0}, "points[1].step"),
    ({"key": "loss_0", "split": "train", "step": 1, "value": "1.0"}, "points[1].value"),
    ({"key": "loss_0", "split": "train", "step": 1, "value": "nan"}, "points[1].value"),
    ({"key": "loss_0", "split": "train", "step": 1}, "points[1].value"),
    ({"key": "loss_0", "split": "train", "step": 1, "value": 1.0, "wall": 3}, "points[1].wall"),
    ({"key": "loss_0", "split": "train", "step": 0, "value": 9.0}, "points[1].step"),  # step 0 twice
    ({"key": "loss_0", "split": "train", "step": 2**53 + 1, "value": 1.0}, "points[1].step"),  # not exact in JS
    ({"key": "loss_0", "split": "train", "step": 1, "value": 1.0, "epoch": 2**63}, "points[1].epoch"),
    ({"key": "loss_0", "split": "train", "step": 1, "value": 1.0, "epoch": -0.5}, "points[1].epoch"),
    ("loss=1", "points[1]"),
])
def test_a_bad_point_is_refused_naming_it_and_nothing_of_the_batch_is_stored(scripts, point, field):
    launcher = scripts["launcher"]
    run = _create(launcher)
    good = {"key": "loss_0", "split": "train", "step": 0, "value": 2.0}
    status, answer, _ = launcher("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": [good, point]})
    assert status == 400 and list(answer["fields"]) == [field], answer
    assert field in answer["error"]
    assert not MetricSeries.objects.filter(training_run__run_id=run["id"]).exists()
    assert not MetricChunk.objects.filter(series__training_run__run_id=run["id"]).exists()


def test_a_batch_past_the_limit_or_not_a_list_is_refused(scripts):
    launcher = scripts["launcher"]
    run = _create(launcher)
    url = f"/api/v1/runs/{run['id']}/metrics/"
    many = [{"key": "loss_0", "split": "train", "step": i, "value": 1.0} for i in range(10_001)]
    for body, field in (({"points": many}, "points"), ({"points": {"step": 1}}, "points"), ({"points": []}, "points"),
                        ({"point": []}, "point")):
        status, answer, _ = launcher("POST", url, body)
        assert (status, list(answer["fields"])) == (400, [field]), answer
    assert not MetricSeries.objects.filter(training_run__run_id=run["id"]).exists()
    exactly = many[:10_000]
    assert launcher("POST", url, {"points": exactly})[1]["accepted"] == 10_000


def test_each_role_and_owner(scripts):
    status, answer, _ = scripts["viewer"]("POST", "/api/v1/runs/", {"external": True, "name": "x", "config": {}})
    assert status == 403 and "ext-viewer may not report" in answer["error"]
    assert not PipelineRun.objects.filter(external=True).exists()
    run = _create(scripts["launcher"])
    url = f"/api/v1/runs/{run['id']}/metrics/"
    for role in ("viewer", "other_launcher"):
        status, answer, _ = scripts[role]("POST", url, {"points": BATCH})
        assert status == 403 and answer["fields"] == {}, (role, answer)
    assert "ext-launcher-2 may not report run" in answer["error"]
    for role in ("viewer", "other_launcher"):
        assert scripts[role]("POST", f"/api/v1/runs/{run['id']}/end/", {"status": "failed"})[0] == 403
    assert not MetricSeries.objects.filter(training_run__run_id=run["id"]).exists()
    status, counts, _ = scripts["admin"]("POST", url, {"points": BATCH})
    assert (status, counts["accepted"]) == (200, 4)
    status, answer, _ = scripts["viewer"]("GET", url + "?keys=loss_0&split=train")  # reading is every role's
    assert status == 200 and answer["series"][0]["steps"] == [0, 10, 20]


def test_bad_tokens_and_unknown_runs_answer_json(scripts, live_server):
    run = _create(scripts["launcher"])
    url = f"/api/v1/runs/{run['id']}/metrics/"
    for script in (Script(live_server.url, "e3w_not_a_token"), Script(live_server.url, None)):
        status, answer, response = script("POST", url, {"points": BATCH})
        assert status == 401 and response.getheader("WWW-Authenticate") == 'Bearer realm="eagle3web"', answer
    assert scripts["launcher"]("POST", "/api/v1/runs/", {"name": "x", "config": {}, "external": False})[1][
        "fields"] == {"external": "external must be true for a run trained elsewhere; omit it to launch a pipeline run"}
    for path in ("metrics", "end", "checkpoints"):
        status, answer, _ = scripts["launcher"]("POST", f"/api/v1/runs/999999999/{path}/",
                                                {"points": BATCH} if path == "metrics" else
                                                {"status": "failed"} if path == "end" else {"path": "/x", "epoch": 0})
        # The one rule's words (runs.projects.access), the same for a run in a project one does not see.
        assert (status, answer["error"]) == (404, "no run 999999999")
    assert not MetricSeries.objects.filter(training_run__run_id=run["id"]).exists()


def test_bad_settings_are_refused_naming_the_field(scripts, roots):
    launcher = scripts["launcher"]
    for body, field in (({"name": "x", "config": [1, 2]}, "config"), ({"config": {}}, "name"),
                        ({"name": "x"}, "config"), ({"name": "x", "config": {}, "target": "/etc"}, "target"),
                        ({"name": "x", "config": {}, "dataset": str(roots / "missing.jsonl")}, "dataset"),
                        ({"name": "x", "config": {}, "epochs": 3}, "epochs")):
        status, answer, _ = launcher("POST", "/api/v1/runs/", {"external": True, **body})
        assert status == 400 and list(answer["fields"]) == [field], (body, answer)
    assert not PipelineRun.objects.exists()
    run = _create(launcher, target=str(roots / "target"), dataset=str(roots / "chats.jsonl"))
    assert (run["target"]["name"], run["dataset"]["path"]) == ("target", str((roots / "chats.jsonl").resolve()))


def test_a_pipeline_run_refuses_points_and_an_ended_run_refuses_more(scripts, roots):
    launcher = scripts["launcher"]
    status, pipeline, _ = launcher("POST", "/api/v1/runs/", {
        "target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "epochs": 1, "draft_vocab_size": 64})
    assert status == 201 and pipeline["external"] is False
    for path, body in (("metrics", {"points": BATCH}), ("end", {"status": "succeeded"}),
                       ("checkpoints", {"path": str(roots / "target"), "epoch": 0})):
        status, answer, _ = launcher("POST", f"/api/v1/runs/{pipeline['id']}/{path}/", body)
        assert status == 409 and f"run {pipeline['id']} is a pipeline run" in answer["error"], answer
    assert not MetricSeries.objects.filter(training_run__run_id=pipeline["id"]).exists()

    run = _create(launcher)
    status, answer, _ = launcher("POST", f"/api/v1/runs/{run['id']}/end/", {"status": "done"})
    assert (status, list(answer["fields"])) == (400, ["status"])
    status, ended, _ = launcher("POST", f"/api/v1/runs/{run['id']}/end/",
                                {"status": "failed", "message": "NCCL timeout on node 7"})
    assert (status, ended["status"]) == (200, "failed")
    status, answer, _ = launcher("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": BATCH})
    assert status == 409 and "has ended (failed" in answer["error"]
    assert launcher("POST", f"/api/v1/runs/{run['id']}/end/", {"status": "succeeded"})[0] == 409
    status, summary, _ = launcher("GET", f"/api/v1/runs/{run['id']}/")
    assert (summary["status"], summary["finished"], summary["stages"][0]["error"]) == (
        "failed", True, "NCCL timeout on node 7")
    assert not MetricSeries.objects.filter(training_run__run_id=run["id"]).exists()
    # Cancelling one just ends it; retrying one is refused: nothing of it runs here.
    other = _create(launcher)
    assert launcher("POST", f"/api/v1/runs/{other['id']}/cancel/", {})[1]["cancelled"] == 1
    assert launcher("GET", f"/api/v1/runs/{other['id']}/")[1]["status"] == "cancelled"
    status, answer, _ = launcher("POST", f"/api/v1/runs/{other['id']}/retry/", {})
    assert status == 400 and "was trained elsewhere" in answer["error"]


def test_every_write_is_in_the_audit_trail_with_the_tokens_user(scripts):
    launcher = scripts["launcher"]
    run = _create(launcher)
    launcher("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": BATCH})
    scripts["other_launcher"]("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": BATCH})
    launcher("POST", f"/api/v1/runs/{run['id']}/end/", {"status": "succeeded"})
    entries = [(e.user.username, e.token.name, e.method, e.path, e.status) for e in
               ApiAuditEntry.objects.filter(method="POST").select_related("user", "token").order_by("id")]
    assert entries == [
        ("ext-launcher", "launcher trainer", "POST", "/api/v1/runs/", 201),
        ("ext-launcher", "launcher trainer", "POST", f"/api/v1/runs/{run['id']}/metrics/", 200),
        ("ext-launcher-2", "other_launcher trainer", "POST", f"/api/v1/runs/{run['id']}/metrics/", 403),
        ("ext-launcher", "launcher trainer", "POST", f"/api/v1/runs/{run['id']}/end/", 200)]


def test_the_pages_show_it_beside_pipeline_runs_with_its_badge(scripts, roots):
    launcher = scripts["launcher"]
    status, pipeline, _ = launcher("POST", "/api/v1/runs/", {
        "target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "epochs": 1, "draft_vocab_size": 64,
        "name": "ours"})
    run = _create(launcher)
    launcher("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": BATCH})
    status, listed, _ = scripts["viewer"]("GET", "/api/v1/runs/?status=running")
    assert [(r["id"], r["external"], r["status"]) for r in listed["results"]] == [(run["id"], True, "running")]
    browser = Client()
    browser.force_login(make_user("ext-page-viewer", "viewer"))

    def row_of(page: str, run_id: int) -> str:
        row = page[page.index(f'data-run="{run_id}"'):]
        return row[:row.index("</tr>")]

    page = browser.get("/").content.decode()
    external_row, pipeline_row = row_of(page, run["id"]), row_of(page, pipeline["id"])
    assert 'class="badge external"' in external_row and "llama on slurm" in external_row
    assert "train (elsewhere)" in external_row and "launch a copy" not in external_row
    assert "badge external" not in pipeline_row and "launch a copy" in pipeline_row
    detail = browser.get(f"/runs/{run['id']}/").content.decode()
    assert "reports from elsewhere" in detail and "Train draft (elsewhere)" in detail
    assert 'data-glance="reported_step">20<' in detail and 'data-glance="eta"' not in detail
    assert 'id="retry-form"' not in detail
    poll = browser.get(f"/api/v1/runs/{run['id']}/status/").json()
    assert (poll["external"], poll["status"], poll["glance"]["latest"]["step"]) == (True, "running", 20)
    compare = browser.get(f"/runs/compare/?ids={pipeline['id']}&ids={run['id']}").content.decode()
    metrics = compare[compare.index('id="compare-metrics"'):]
    loss_row = metrics[metrics.index("<th>train loss_0</th>"):]
    loss_row = loss_row[:loss_row.index("</tr>")]
    # 4 significant digits (a learning rate of 3e-05 printed with 4 decimals read 0.0000).
    # its last and min; ours none
    assert loss_row.count(">1.25<") + loss_row.count(">1.25 ·") == 2 and '<span class="hint">–</span>' in loss_row
    assert "not measured here" in compare and compare.count('class="badge external"') == 1
    launcher("POST", f"/api/v1/runs/{run['id']}/end/", {"status": "succeeded"})
    status, listed, _ = scripts["viewer"]("GET", "/api/v1/runs/?status=succeeded")
    assert [(r["id"], r["status"]) for r in listed["results"]] == [(run["id"], "succeeded")]


@pytest.fixture(scope="module")
def trained_elsewhere(tmp_path_factory):
    """A real speculators Eagle3DraftModel for a small random Llama, saved as a trainer saves one
    (save_pretrained), and that Llama: (target, checkpoint)."""
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.contract.target import default_layer_ids
    from workers.stages.train.draft.model import build_draft_model

    work = tmp_path_factory.mktemp("trained-elsewhere")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
                     ).save_pretrained(str(work / "target"))
    d2t, t2d = build_vocab_mappings_from_distribution({i: 256 - i for i in range(256)}, 64, 256)
    np.save(work / "d2t.npy", d2t.numpy())
    np.save(work / "t2d.npy", t2d.numpy())
    draft = build_draft_model(target_dir=work / "target", layer_ids=default_layer_ids(8), d2t_path=work / "d2t.npy",
                              t2d_path=work / "t2d.npy", draft_vocab_size=64, ttt_steps=2)
    draft.save_pretrained(str(work / "ckpt"))
    (work / "ckpt" / "val_metrics.json").write_text(json.dumps({"loss_epoch": 1.375}))
    return work / "target", work / "ckpt"


def test_a_checkpoint_registered_by_path_is_checked_as_an_import_is(scripts, roots, trained_elsewhere):
    target, ckpt = trained_elsewhere
    shutil.copytree(target, roots / "llama")
    shutil.copytree(ckpt, roots / "ckpt" / "2")
    shutil.copytree(ckpt, roots / "broken")
    (roots / "broken" / "model.safetensors").unlink()
    launcher = scripts["launcher"]
    run = _create(launcher, target=str(roots / "llama"))
    url = f"/api/v1/runs/{run['id']}/checkpoints/"
    for body, field, words in (
            ({"path": str(roots / "broken"), "epoch": 1}, "path", "no model.safetensors"),
            ({"path": "/etc", "epoch": 1}, "path", "/etc"),
            ({"path": str(roots / "ckpt" / "2"), "epoch": -1}, "epoch", "epoch must be a whole number"),
            ({"path": str(roots / "ckpt" / "2"), "epoch": 1, "verifier": str(roots / "target")}, "path",
             "is not the verifier")):
        status, answer, _ = launcher("POST", url, body)
        assert status == 400 and list(answer["fields"]) == [field] and words in answer["error"], (body, answer)
    assert not Checkpoint.objects.exists()
    status, made, _ = launcher("POST", url, {"path": str(roots / "ckpt" / "2"), "epoch": 2})
    assert status == 201, made
    assert (made["epoch"], made["verifier_path"], made["val_loss"], made["created"]) == (
        2, str((roots / "llama").resolve()), 1.375, True)
    assert launcher("POST", url, {"path": str(roots / "ckpt" / "2"), "epoch": 2})[:2] == (200, {**made, "created": False})
    status, summary, _ = launcher("GET", f"/api/v1/runs/{run['id']}/")
    assert [(c["id"], c["epoch"], c["val_loss"]) for c in summary["checkpoints"]] == [(made["id"], 2, 1.375)]
    assert f"--speculative-config" in summary["checkpoints"][0]["serve_command"]
    status, detail, _ = launcher("GET", f"/api/v1/checkpoints/{made['id']}/")
    assert status == 200 and detail["path"] == str((roots / "ckpt" / "2").resolve())
    page = Client()
    page.force_login(make_user("ext-checkpoint-viewer", "viewer"))
    shown = page.get(f"/checkpoints/{made['id']}/")
    assert shown.status_code == 200 and "llama on slurm" in shown.content.decode()
    # Measured only on a prompts file: a run trained elsewhere has no prepared validation conversations here.
    status, answer, _ = launcher("POST", f"/api/v1/checkpoints/{made['id']}/evaluate/", {})
    assert status == 400 and "was not trained here" in answer["error"], answer


def test_the_largest_step_and_epoch_a_report_may_carry_are_stored(scripts):
    launcher = scripts["launcher"]
    run = _create(launcher)
    top = {"key": "loss_0", "split": "train", "step": 2**53, "value": 1.0, "epoch": 1_000_000}
    status, answer, _ = launcher("POST", f"/api/v1/runs/{run['id']}/metrics/", {"points": [top]})
    assert status == 200 and answer["accepted"] == 1, answer
    assert MetricSeries.objects.get(training_run__run_id=run["id"], key="loss_0").last_step == 2**53
