"""A run that asks for a serve check: refused at launch when nobody could run it, queued on vLLM's
queue once its measurement is recorded, and once only."""
from pathlib import Path

import pytest

from runs.pipeline import services
from runs.pipeline.jobs.models import ServeCheck
from runs.models import Checkpoint, PendingEnqueue, StageStatus
from runs.pipeline.dispatch.queue import job_queue
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.checkpoints.serve_check_services import serve_check_request
from runs.pipeline.lifecycle.result_records import evaluation_record
from runs.pipeline.lifecycle.stage_services import stage_start
from tests.helpers.fleet import cpu_worker, fake_gpu_worker

pytestmark = pytest.mark.django_db


def _launch(user, roots, **config):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config), enqueue=False)


def _measured(run, tau: float = 2.5):
    """The run's evaluate stage recording a measurement of its best checkpoint, as a worker does."""
    from workers.stages.evaluate.measure import EvaluationResult

    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/ckpt",
                                           is_best=True)
    type(run.evaluation).objects.filter(pk=run.evaluation.pk).update(checkpoint=checkpoint)
    started = stage_start(stage_name="evaluate", record_id=run.evaluation.pk, worker="test").started_at
    result = EvaluationResult(
        checkpoint_dir=Path(checkpoint.path), target_dir=Path(run.target.path), num_speculative_tokens=3,
        max_new_tokens=64, num_prompts=4, prompt_source="validation", tau=tau, acceptance_per_position=[0.5, 0.3, 0.2],
        new_tokens=256, verify_forwards=100, output_matches_greedy=True, mismatched_prompts=[], spec_seconds=1.0,
        greedy_seconds=2.0, spec_tokens_per_s=256.0, greedy_tokens_per_s=128.0, speedup=2.0, device="cpu", seconds=3.0)
    evaluation_record(record_id=run.evaluation.pk, result=result, log_tail="", started_at=started)
    return checkpoint


def test_a_serve_check_nobody_takes_is_refused_at_launch_naming_the_field(user, roots):
    cpu_worker("cpu@this-host", probe_queues=False)  # -Q cpu,gpu only: no vLLM queue
    with pytest.raises(RunConfigError, match=r"^serve_check: no live worker takes vllm\.1 \(vLLM on 1 GPU\)") as caught:
        _launch(user, roots, serve_check=True)
    assert caught.value.field == "serve_check"
    assert _launch(user, roots).config["serve_check"] is False


def test_a_run_that_asks_for_it_gets_one_serve_check_of_its_measurement_on_vllms_queue(user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE: a vLLM host on 2 GPUs
    run = _launch(user, roots, serve_check=True, extraction_backend="vllm", tensor_parallel_size=2)
    outbox = PendingEnqueue.objects.filter(kind="serve_check").count()
    checkpoint = _measured(run)
    check = ServeCheck.objects.get()
    assert (check.checkpoint, check.evaluation_id, check.status, check.requested_by) == (
        checkpoint, run.evaluation.pk, StageStatus.QUEUED, None)
    assert check.tensor_parallel_size == 2 and job_queue(job_name="serve_check", record_id=check.pk) == "vllm.2"
    assert PendingEnqueue.objects.filter(kind="serve_check").count() == outbox + 1
    # Asked again (a click on the checkpoint's page) while it waits: the same one.
    again, created = serve_check_request(checkpoint=checkpoint, user=user, enqueue=False)
    assert (again, created) == (check, False) and ServeCheck.objects.count() == 1


def test_a_run_that_does_not_ask_gets_none(user, roots):
    run = _launch(user, roots)
    _measured(run)
    assert ServeCheck.objects.count() == 0
