"""What `eagle3web` prints without --json (issue 28): one human line per answer, naming the run by its
id and name (an unnamed run by its id alone, no stray spaces, colons or parentheses), its state, the
stage it is at with its progress, and τ once known; `create-external` its id alone; JSON only with --json.
And what the client refuses before sending anything: a point JSON cannot carry (NaN, infinity) is an
ApiError naming its key, split and step. main() runs in this process against a real server (live_server)."""
from __future__ import annotations

import json
import math
import re
from datetime import timedelta

import httpx
import numpy as np
import pytest
from django.utils import timezone

from eagle3web_client import ApiError, Client
from eagle3web_client import cli
from runs.models import Evaluation, StageStatus, TrainingRun
from runs.pipeline import services
from runs.pipeline.models import PipelineRun
from runs.pipeline.launch.run_config import RunConfig

STRAY = re.compile(r" :| ,|  |\(\)|\( | \)|:$|: ,|^ | $")


def run_cli(capsys, url: str, token: str, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--url", url, "--token", token, *args])
    out, err = capsys.readouterr()
    return code, out, err


def _clean(line: str) -> None:
    assert STRAY.search(line) is None, f"stray spaces or punctuation in {line!r}"


@pytest.fixture
def owner(launcher_token):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="cluster-bot")


def _run(owner, roots, name: str = "") -> PipelineRun:
    return services.run_launch(user=owner, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64), name=name, enqueue=False)


def _stages(run: PipelineRun, **statuses: str) -> None:
    from runs.models import ExtractStage, Preparation, VocabMapping

    for model, name in ((Preparation, "prepare"), (ExtractStage, "extract"), (VocabMapping, "vocab"),
                        (TrainingRun, "train")):
        if name in statuses:
            model.objects.filter(run=run).update(status=statuses[name])


def test_status_says_name_id_state_stage_progress_and_tau(live_server, launcher_token, owner, roots, capsys):
    run = _run(owner, roots, name="llama eagle3")
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "status", str(run.pk))
    assert (code, err) == (0, "")
    assert out == f"run {run.pk} (llama eagle3): queued, prepare queued\n"

    _stages(run, prepare=StageStatus.SUCCEEDED, extract=StageStatus.SUCCEEDED, vocab=StageStatus.SUCCEEDED)
    TrainingRun.objects.filter(run=run).update(status=StageStatus.RUNNING, progress_done=120, progress_total=400,
                                               started_at=timezone.now() - timedelta(seconds=60))
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "status", str(run.pk))
    # 60 s for 120 of 400 steps: 280 more take about 140 s.
    assert code == 0 and re.fullmatch(
        rf"run {run.pk} \(llama eagle3\): running, train 120/400 \(30%\), about 2 min left\n", out), out

    TrainingRun.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, progress_done=400)
    Evaluation.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, tau=2.4123)
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "status", str(run.pk))
    assert (code, out) == (0, f"run {run.pk} (llama eagle3): succeeded, tau 2.41\n")

    # The JSON is the API's answer, whole.
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "--json", "runs", "status", str(run.pk))
    answer = json.loads(out)
    assert (answer["id"], answer["name"], answer["status"], answer["acceptance"]["tau"]) == (
        run.pk, "llama eagle3", "succeeded", 2.4123)


def test_a_failed_run_says_where_and_why_and_an_unnamed_one_is_its_id(live_server, launcher_token, owner, roots,
                                                                     capsys):
    run = _run(owner, roots)
    _stages(run, prepare=StageStatus.SUCCEEDED)
    from runs.models import ExtractStage

    ExtractStage.objects.filter(run=run).update(status=StageStatus.FAILED,
                                                error="CUDA out of memory\nTraceback (most recent call last): ...")
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "status", str(run.pk))
    assert (code, out) == (0, f"run {run.pk}: failed, extract failed: The GPU ran out of memory during extraction: "
                           "retry when the GPU is less busy, or use a GPU with more memory.\n")
    _clean(out.strip())


def test_cancel_prints_a_line_and_json_only_with_json(live_server, launcher_token, owner, roots, capsys):
    run = _run(owner, roots, name="to cancel")
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "cancel", str(run.pk))
    assert (code, out, err) == (0, f"run {run.pk} (to cancel): 5 unfinished stages cancelled, now cancelled\n", "")
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "cancel", str(run.pk))
    assert (code, out) == (0, f"run {run.pk} (to cancel): nothing to cancel, already cancelled\n")
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "--json", "runs", "cancel", str(run.pk))
    assert code == 0 and json.loads(out) == {"id": run.pk, "cancelled": 0}


def test_create_external_prints_its_id_and_end_names_the_run(live_server, launcher_token, capsys):
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "create-external", "--name",
                             "llama on slurm", "--config", '{"epochs": 2}')
    assert code == 0 and err == "" and re.fullmatch(r"\d+\n", out), out  # RUN=$(eagle3web runs create-external ...)
    run_id = int(out)
    assert PipelineRun.objects.get(pk=run_id).name == "llama on slurm"
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "end", str(run_id), "--status", "failed",
                             "--message", "node lost")
    assert (code, out, err) == (0, f"run {run_id} (llama on slurm) ended: failed\n", "")
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "status", str(run_id))
    assert (code, out) == (0, f"run {run_id} (llama on slurm): failed, train failed: node lost\n")
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "--json", "runs", "create-external", "--name", "b")
    assert code == 0 and json.loads(out)["name"] == "b"


def test_launch_list_and_wait_print_lines(live_server, launcher_token, owner, roots, capsys):
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "list")
    assert (code, out, err) == (0, "", "eagle3web: no runs\n")  # nothing on stdout for a script's loop
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "launch", "--target",
                             str(roots / "target"), "--dataset", str(roots / "chats.jsonl"), "--draft-vocab-size", "64",
                             "--name", "from the shell")
    assert code == 0 and err == "", err
    run = PipelineRun.objects.get()
    assert out == f"launched run {run.pk} (from the shell): queued, prepare queued; {live_server.url}/runs/{run.pk}/\n"
    unnamed = _run(owner, roots)
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "list")
    assert (code, out) == (0, f"{unnamed.pk}\tqueued\trun {unnamed.pk}\n{run.pk}\tqueued\tfrom the shell\n")
    services.run_cancel(run=run, user=owner)
    code, out, _ = run_cli(capsys, live_server.url, launcher_token, "runs", "wait", str(run.pk))
    assert (code, out) == (4, f"run {run.pk} (from the shell): cancelled\n")
    code, out, err = run_cli(capsys, live_server.url, launcher_token, "runs", "wait", str(unnamed.pk), "--wait-timeout",
                             "0.2", "--poll", "0.1")
    assert (code, out, err) == (3, "", f"eagle3web: run {unnamed.pk} is still queued after 0.2 s\n")


# Answers as the API gives them, for shapes a live server gives only after hours (a stage at 0 of an
# unknown total) or never (an older server without `glance`): the text still reads cleanly.
@pytest.mark.parametrize(("answer", "line"), [
    ({"id": 7, "name": "run 7", "status": "running", "finished": False,
      "glance": {"stage": "extract", "stage_status": "running", "progress_done": 0, "progress_total": 0}},
     "run 7: running, extract started"),
    ({"id": 7, "name": "", "status": "running", "finished": False,
      "glance": {"stage": "train", "stage_status": "running", "progress_done": 3, "progress_total": None,
                 "eta_seconds": None}},
     "run 7: running, train 3"),
    ({"id": 7, "name": "  spaced  name ", "status": "succeeded", "finished": True, "acceptance": {"tau": None},
      "glance": {"best_tau": 3.014}},
     "run 7 (spaced name): succeeded, tau 3.01"),
    ({"id": 7, "status": "queued"}, "run 7: queued"),
    ({"id": 7, "name": "x", "status": "queued", "finished": False, "waiting_for_queue": {"attempts": 2},
      "glance": {"stage": "prepare", "stage_status": "queued"}},
     "run 7 (x): queued, prepare queued, waiting for the server's queue"),
])
def test_status_lines_from_answers_of_every_shape(answer, line, capsys, monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    real = cli.Client
    monkeypatch.setattr(cli, "Client", lambda url, token, **kw: real(url, token, transport=httpx.MockTransport(handler),
                                                                       **kw))
    code, out, _ = run_cli(capsys, "http://eagle3web.test", "e3w_x", "runs", "status", "7")
    assert (code, out) == (0, line + "\n")
    _clean(line)


def _recording_client() -> tuple[Client, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        points = json.loads(request.content)["points"]
        return httpx.Response(200, json={"accepted": len(points), "unchanged": 0, "replaced": 0})

    return Client("http://eagle3web.test", "e3w_x", transport=httpx.MockTransport(handler), retries=0), sent


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_a_non_finite_value_is_an_api_error_naming_the_point_and_nothing_is_sent(bad):
    client, sent = _recording_client()
    points = [{"key": "loss_0", "split": "train", "step": s, "value": 1.0} for s in range(1, 10_005)]
    points[10_002] = {"key": "loss_1", "split": "val", "step": 10_003, "value": bad}  # in the second batch
    with pytest.raises(ApiError) as raised:
        client.runs.log_metrics(5, points)
    message = str(raised.value)
    assert "loss_1" in message and "val" in message and "10003" in message and "nothing was sent" in message
    assert raised.value.status is None and list(raised.value.fields) == ["points"]
    assert sent == []  # not even the first, good, batch


def test_a_non_finite_epoch_or_a_point_that_is_no_mapping_is_an_api_error():
    client, sent = _recording_client()
    with pytest.raises(ApiError, match="epoch"):
        client.runs.log_metrics(5, [{"key": "loss", "split": "train", "step": 1, "value": 1.0, "epoch": math.nan}])
    with pytest.raises(ApiError, match="point 1 is not a mapping"):
        client.runs.log_metrics(5, [{"key": "loss", "split": "train", "step": 1, "value": 1.0}, ("loss", 2)])
    with pytest.raises(ApiError, match="loss.*train.*step 1.*not a number JSON can carry"):
        client.runs.log_metrics(5, [{"key": "loss", "split": "train", "step": 1, "value": object()}])
    assert sent == []


def test_numpy_numbers_are_sent_as_json_numbers():
    client, sent = _recording_client()
    answer = client.runs.log_metrics(5, [{"key": "loss", "split": "train", "step": np.int64(3),
                                          "value": np.float32(0.5), "epoch": np.float64(0.25)}])
    assert answer == {"accepted": 1, "unchanged": 0, "replaced": 0}
    assert json.loads(sent[0].content) == {"points": [{"key": "loss", "split": "train", "step": 3, "value": 0.5,
                                                       "epoch": 0.25}]}
