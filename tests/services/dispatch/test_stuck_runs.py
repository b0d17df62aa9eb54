"""A run whose queue no live worker takes: the run page says which queue and what to do, and a
retry is refused (saying why) rather than queued where nobody takes it; with no worker live at all
a run on the default backends still retries, as in a demo whose worker starts later."""
from __future__ import annotations

import pytest

from runs.pipeline import services
from runs.fleet.services import worker_stopped
from runs.models import PendingEnqueue, PipelineRun, StageStatus
from runs.pipeline.lifecycle.stages import STAGES
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from tests.helpers.fleet import cpu_host_capabilities, cpu_worker, fake_gpu_worker

pytestmark = pytest.mark.django_db

STUCK = ("waiting in queue vllm.2, which no live worker takes: start a worker with vLLM on 2 GPUs, or cancel and "
         "launch a copy with another backend")


def _launch(user, roots, **config) -> PipelineRun:
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config))


def _statuses(run: PipelineRun) -> list[str]:
    return [stage.model.objects.get(run=run).status for stage in STAGES]


def _stage_detail(html: str, name: str) -> str:
    return html.split(f'data-stage-detail="{name}"')[1].split("</tr>")[0]


def test_run_page_names_the_queue_nobody_takes_and_what_to_do(client, user, roots):
    cpu_worker("cpu@this-host")
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE: the vLLM host the launch was checked against
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    client.force_login(user)
    assert 'data-field="queue-note"' not in client.get(f"/runs/{run.pk}/").content.decode()

    worker_stopped(name="fake-gpu@fake-gpu-host")  # the only worker that takes vllm.2 goes away
    html = client.get(f"/runs/{run.pk}/").content.decode()
    extract = _stage_detail(html, "extract")
    assert STUCK in extract and f'href="/runs/new/?copy={run.pk}">launch a copy</a>' in extract
    assert 'data-field="queue-note"' not in _stage_detail(html, "prepare")  # cpu@this-host takes cpu

    worker_stopped(name="cpu@this-host")
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "waiting in queue cpu, which no live worker takes: start a worker that takes cpu" in \
        _stage_detail(html, "prepare")
    assert "waiting in queue gpu, which no live worker takes" in _stage_detail(html, "train")


def test_retry_is_refused_while_no_live_worker_takes_the_runs_backend_then_accepted(client, user, roots):
    cpu_worker("cpu@this-host")
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    services.run_cancel(run=run, user=user)
    worker_stopped(name="fake-gpu@fake-gpu-host")
    before = PendingEnqueue.objects.count()
    client.force_login(user)

    response = client.post(f"/runs/{run.pk}/retry/", follow=True)
    assert response.redirect_chain == [(f"/runs/{run.pk}/", 302)]
    html = response.content.decode()
    # This host: no vLLM, or vLLM's CPU build, which runs on one device, never on 2 GPUs.
    why = ("extraction_backend vllm: no live worker has vLLM" if cpu_host_capabilities()["backends"]["vllm"]
           else "tensor_parallel_size 2: no live worker that runs vLLM has a GPU: it runs on the CPU")
    assert f"{run} cannot be retried now: {why}" in html
    assert "launch a copy with another backend" in html
    assert set(_statuses(run)) == {StageStatus.CANCELLED} and PendingEnqueue.objects.count() == before

    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE: back
    assert services.run_retry(run=run, user=user) == 5
    assert set(_statuses(run)) == {StageStatus.QUEUED}


def test_retry_checks_only_the_stages_it_queues_again(user, roots):
    cpu_worker("cpu@this-host")
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE
    run = _launch(user, roots, extraction_backend="vllm", tensor_parallel_size=2)
    for stage in STAGES[:2]:  # prepare and the vLLM extraction are done
        stage.model.objects.filter(run=run).update(status=StageStatus.SUCCEEDED)
    services.run_cancel(run=run, user=user)
    worker_stopped(name="fake-gpu@fake-gpu-host")
    # FAKE: no vLLM, but Transformers on 2 GPUs, where measuring acceptance loads the target.
    fake_gpu_worker("spread@fake-gpu-host", gpus=2, vllm=False)
    assert services.run_retry(run=run, user=user) == 3  # vocab, train and evaluate: live workers take them


def test_retry_of_a_default_run_with_no_worker_live_queues_it_as_before(user, roots):
    run = _launch(user, roots)
    services.run_cancel(run=run, user=user)
    assert services.run_retry(run=run, user=user) == 5


def test_retry_of_a_run_whose_config_names_an_unknown_backend_is_refused(user, roots):
    run = _launch(user, roots)
    services.run_cancel(run=run, user=user)
    PipelineRun.objects.filter(pk=run.pk).update(config={**run.config, "extraction_backend": "vLLM"})
    with pytest.raises(RunConfigError, match="extraction_backend: unknown backend 'vLLM'; no worker takes it"):
        services.run_retry(run=PipelineRun.objects.get(pk=run.pk), user=user)
    assert set(_statuses(run)) == {StageStatus.CANCELLED}
