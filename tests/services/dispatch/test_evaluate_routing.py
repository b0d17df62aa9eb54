"""Measuring acceptance loads the whole target with Transformers on the run's extraction GPU count
(tensor_parallel_size): a run's evaluate stage goes to "gpu" on one GPU, else to transformers.<n>,
and a launch or retry is refused, naming tensor_parallel_size and why, when no live worker takes
that queue or holds the target there. A standalone evaluation (a checkpoint's "Measure acceptance")
stays on "gpu"."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from runs.pipeline.dispatch import queue as run_queue
from runs.pipeline import services
from runs.checkpoints.evaluation import evaluation_request
from runs.fleet.services import worker_stopped
from runs.models import Checkpoint, Evaluation, PendingEnqueue, PipelineRun, StageStatus
from runs.pipeline.dispatch.routing import stage_backend, stage_problem, stage_queue
from runs.pipeline.lifecycle.stages import STAGES
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from tests.helpers.fleet import cpu_worker, fake_gpu_worker
from workers.contract.host import backends

pytestmark = pytest.mark.django_db

NEEDS_2 = "tensor_parallel_size 2: measuring acceptance loads the target with Transformers on 2 GPUs: "


def _launch(user, roots, **config) -> PipelineRun:
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config))


def _refused(user, roots, **config) -> str:
    before = (PipelineRun.objects.count(), PendingEnqueue.objects.count())
    with pytest.raises(RunConfigError) as caught:
        _launch(user, roots, **config)
    assert caught.value.field == "tensor_parallel_size", str(caught.value)
    assert (PipelineRun.objects.count(), PendingEnqueue.objects.count()) == before
    return str(caught.value)


def _vllm_and_spread_workers() -> None:
    """FAKE: vLLM on 2 GPUs on one host, Transformers on 2 GPUs on another, and this host for the rest."""
    cpu_worker("cpu@this-host")
    fake_gpu_worker("vllm@fake-gpu-host", gpus=2, queues=["vllm.2"])
    fake_gpu_worker("spread@fake-gpu-host", gpus=2, queues=["transformers.2"])


def test_evaluate_goes_where_the_extractions_gpu_count_says_and_never_raises():
    vllm_4 = {"extraction_backend": "vllm", "tensor_parallel_size": 4}
    assert stage_backend(stage_name="evaluate", config=vllm_4) == ("transformers", 4)
    assert stage_queue(stage_name="evaluate", config=vllm_4) == "transformers.4"
    assert stage_queue(stage_name="evaluate", config={"extraction_backend": "vllm", "tensor_parallel_size": 1}) == "gpu"
    assert stage_queue(stage_name="evaluate", config={}) == "gpu"  # a run from before GPU counts, or no run at all
    # A config edited behind the launch checks is shown, never raised: nobody takes transformers.0.
    broken = {"tensor_parallel_size": "four"}
    assert stage_queue(stage_name="evaluate", config=broken) == "transformers.0"
    assert stage_problem(stage_name="evaluate", config=broken) == \
        "tensor_parallel_size 'four' is not a GPU count from 1 to 64"


def test_a_runs_hand_overs_send_evaluate_to_transformers_on_its_gpus_and_a_standalone_one_to_gpu(user, roots,
                                                                                                 monkeypatch):
    fake_gpu_worker("fake-gpu@fake-gpu-host")  # FAKE: 8 GPUs, vLLM, takes every queue they serve
    cpu_worker("cpu@this-host")
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=4)
    sent: list[tuple[str, str]] = []
    # What the broker would be handed, not sent: the stage's name for a run's stage, else the task's.
    monkeypatch.setattr(run_queue.celery_app, "send_task", lambda name, args, queue: sent.append(
        (args[0] if name == run_queue.STAGE_TASK else name, queue)))
    for stage in STAGES:  # each stage's success hands over the next one
        run_queue._send(PendingEnqueue.Kind.PIPELINE, run.pk)
        stage.model.objects.filter(run=run).update(status=StageStatus.SUCCEEDED)
    run_queue._send(PendingEnqueue.Kind.PIPELINE, run.pk)  # every stage done: nothing more to send
    assert sent == [("prepare", "cpu"), ("extract", "vllm.4"), ("vocab", "cpu"), ("train", "gpu"),
                    ("evaluate", "transformers.4")]

    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/ckpt")
    evaluation, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    sent.clear()
    run_queue._send(PendingEnqueue.Kind.EVALUATION, evaluation.pk)
    assert sent == [(run_queue.EVALUATION_TASK, "gpu")]


def test_a_vllm_launch_on_two_gpus_is_refused_while_no_live_worker_takes_transformers_on_two(user, roots):
    cpu_worker("cpu@this-host")
    fake_gpu_worker("vllm-only@fake-gpu-host", gpus=2, queues=["vllm.2"])  # FAKE: -Q vllm.2 alone
    assert _refused(user, roots, extraction_backend="vllm", tensor_parallel_size=2) == (
        NEEDS_2 + "no live worker that runs Transformers has a GPU: it runs on the CPU; vllm-only@fake-gpu-host "
        "could run it but does not take transformers.2 (it takes vllm.2)")
    fake_gpu_worker("spread@fake-gpu-host", gpus=2, queues=["transformers.2"])  # FAKE
    assert _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2).config["tensor_parallel_size"] == 2


def test_the_gpus_measuring_acceptance_runs_on_must_hold_the_target(user, roots):
    cpu_worker("cpu@this-host")
    fake_gpu_worker("vllm@fake-gpu-host", gpus=8, queues=["vllm.2"])  # FAKE: two 80 GiB GPUs for vLLM
    small = fake_gpu_worker("small@fake-gpu-host", gpus=2, queues=["transformers.2"])  # FAKE: two 24 GB GPUs
    small.capabilities["gpus"] = [{"name": "FAKE L4", "memory_bytes": 24_000_000_000}] * 2
    small.save(update_fields=["capabilities"])
    (roots / "target" / "model.safetensors.index.json").write_text(json.dumps(  # FAKE: a 70B target's index
        {"metadata": {"total_size": 140_000_000_000}, "weight_map": {}}))
    assert _refused(user, roots, extraction_backend="vllm", tensor_parallel_size=2) == (
        NEEDS_2 + "the target's weights take 140.0 GB, more than 90% of the memory of Transformers on 2 GPUs: "
        "the best live worker that takes transformers.2, small@fake-gpu-host, has 48.0 GB on 2 GPUs")


def test_an_inline_launch_checks_that_this_host_can_measure_acceptance_on_the_gpus(user, roots, monkeypatch):
    # FAKE probe: this host runs vLLM; it has no GPU (a GPU host's are hidden here), so Transformers
    # cannot spread a target here.
    monkeypatch.setitem(backends.BACKENDS_BY_NAME, "vllm", replace(backends.BACKENDS_BY_NAME["vllm"],
                                                                   check=lambda gpus, have: None))
    monkeypatch.setattr(backends, "detect_gpus", lambda: ())
    with pytest.raises(RunConfigError, match=rf"^{re.escape(NEEDS_2)}Transformers \(transformers\) on 2 GPU\(s\) "
                                             r"cannot run on .+: needs a GPU; this host has none$"):
        services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                            config=RunConfig(draft_vocab_size=64, extraction_backend="vllm", tensor_parallel_size=2),
                            enqueue=False, check="this_host")
    assert PipelineRun.objects.count() == 0


def test_queue_and_run_page_show_evaluate_in_transformers_on_the_runs_gpus(client, user, roots):
    _vllm_and_spread_workers()
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    client.force_login(user)
    html = client.get("/workers/").content.decode()
    row = html.split(f'<tr data-kind="evaluate" data-run="{run.pk}">')[1].split("</tr>")[0]
    assert "<code>transformers.2</code>" in row and "after its prepare stage" in row
    item = next(i for i in client.get("/api/v1/workers/").json()["queue"] if i["kind"] == "evaluate")
    assert (item["run_id"], item["queue"], item["taken_by"]) == (run.pk, "transformers.2", ["spread@fake-gpu-host"])

    worker_stopped(name="spread@fake-gpu-host")  # the only worker that takes transformers.2 goes away
    page = client.get(f"/runs/{run.pk}/").content.decode()
    evaluate = page.split('data-stage-detail="evaluate"')[1].split("</tr>")[0]
    assert ("waiting in queue transformers.2, which no live worker takes: measuring acceptance loads the target "
            "with Transformers on 2 GPUs; start a worker with Transformers on 2 GPUs, or cancel and launch a copy "
            "with fewer GPUs") in evaluate and f'href="/runs/new/?copy={run.pk}">launch a copy</a>' in evaluate
    assert 'data-field="queue-note"' not in page.split('data-stage-detail="extract"')[1].split("</tr>")[0]


def test_retry_of_measuring_acceptance_is_refused_while_nobody_takes_its_gpus(user, roots):
    _vllm_and_spread_workers()
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    for stage in ("preparation", "extract_stage", "vocab_mapping", "training_run"):
        type(getattr(run, stage)).objects.filter(run=run).update(status=StageStatus.SUCCEEDED)
    services.run_cancel(run=run, user=user)
    worker_stopped(name="spread@fake-gpu-host")
    with pytest.raises(RunConfigError) as caught:
        services.run_retry(run=run, user=user)
    assert caught.value.field == "tensor_parallel_size"
    assert str(caught.value).startswith(f"{run} cannot be retried now: {NEEDS_2}")
    assert Evaluation.objects.get(pk=run.evaluation.pk).status == StageStatus.CANCELLED  # nothing queued
    fake_gpu_worker("spread@fake-gpu-host", gpus=2, queues=["transformers.2"])  # FAKE: back
    assert services.run_retry(run=run, user=user) == 1


def test_a_worker_that_cannot_spread_the_target_fails_the_stage_naming_why(user, roots, monkeypatch):
    from workers.orchestration.tasks import stage_execute

    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE: lets the launch through
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    monkeypatch.setattr(backends, "detect_gpus", lambda: ())  # this host has no GPU (a GPU host's are hidden)
    assert stage_execute(stage_name="evaluate", record_id=run.evaluation.pk, worker="cpu@this-host") is False
    run.evaluation.refresh_from_db()
    assert run.evaluation.status == StageStatus.FAILED
    assert run.evaluation.error.startswith("The evaluation reached a worker that cannot run its backend: Transformers "
                                           "(transformers) on 2 GPU(s) cannot run on")
    assert "needs a GPU; this host has none" in run.evaluation.error
