"""A serve check decodes the prompts its measurement decoded, whatever measurement it starts from: the
run's own, or one the pipeline made of another of the run's checkpoints (whose rows once kept
max_prompts at its default, 32, while they decoded the run's eval_prompts). tests/e2e/vllm/test_real_vllm.py
checks the same on a real run's prepared prompts; here the prompts' source is a stand-in, loaded as a
worker would load the PromptSource the plan names (the first `limit` of SOURCE)."""
from pathlib import Path

import pytest

from runs.checkpoints import serve_check_services
from runs.checkpoints.evaluation import EvaluationPlan
from runs.pipeline.lifecycle.result_records import measured_alongside_record
from runs.checkpoints.serve_check_services import ServeCheckRequestError, serve_check_plan, serve_check_request
from runs.models import Checkpoint, Evaluation, StageStatus
from workers.contract.chats.prompt_source import PromptSource
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db

SOURCE = [[1, 2, 3], [4, 5], [6], [7, 8, 9], [10]] * 10  # 50 held-out prompts, in the source's order


@pytest.fixture
def run(user, roots):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(eval_prompts=12, eval_max_new_tokens=48), enqueue=False)


@pytest.fixture
def source(monkeypatch):
    """evaluation_plan's prompts: the first `limit` of SOURCE (what prompts_from_prepared reads), and
    the limits asked for."""
    limits = []

    def plan(*, evaluation, limit=None):
        limit = evaluation.max_prompts if limit is None else limit
        limits.append(limit)
        return EvaluationPlan(Path("/ckpt"), Path("/target"), "validation conversations",
                              PromptSource(kind="prepared", path=Path("/prepared"), limit=limit))

    monkeypatch.setattr(serve_check_services, "evaluation_plan", plan)
    return limits


def _served(plan) -> list[list[int]]:
    """What the worker hands vLLM: the source's prompts as the plan's PromptSource limits them, checked."""
    return plan.prompts_checked(SOURCE[:plan.prompts.limit])


def _result(checkpoint: Checkpoint, num_prompts: int):
    from workers.stages.evaluate.measure import EvaluationResult

    return EvaluationResult(
        checkpoint_dir=Path(checkpoint.path), target_dir=Path("/target"), num_speculative_tokens=3, max_new_tokens=48,
        num_prompts=num_prompts, prompt_source="validation conversations", tau=2.0,
        acceptance_per_position=[0.5, 0.3, 0.2], new_tokens=100, verify_forwards=50, output_matches_greedy=True,
        mismatched_prompts=[], spec_seconds=1.0, greedy_seconds=1.0, spec_tokens_per_s=1.0, greedy_tokens_per_s=1.0,
        speedup=1.0, device="cpu", seconds=1.0)


def test_the_pipelines_measurement_of_another_checkpoint_keeps_the_runs_settings(run):
    other = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/ckpt-0")
    row = measured_alongside_record(measured=run.evaluation, checkpoint_id=other.pk, result=_result(other, 12))
    assert (row.max_prompts, row.num_prompts, row.max_new_tokens, row.prompts_path) == (12, 12, 48, "")
    assert (row.status, row.tau, row.checkpoint_id) == (StageStatus.SUCCEEDED, 2.0, other.pk)


@pytest.mark.parametrize("max_prompts", [12, 32])  # 32: a row recorded before it kept the run's
def test_a_check_serves_the_prompts_its_measurement_decoded(run, source, max_prompts):
    other = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/ckpt-0")
    measured = Evaluation.objects.create(checkpoint=other, status=StageStatus.SUCCEEDED, tau=2.0, num_prompts=12,
                                         max_prompts=max_prompts, max_new_tokens=48)
    check, _ = serve_check_request(checkpoint=other, user=None, enqueue=False)
    plan = serve_check_plan(check=check)
    assert _served(plan) == SOURCE[:12] and source == [12]
    assert (plan.max_new_tokens, check.evaluation_id) == (48, measured.pk)


def test_a_source_that_now_gives_fewer_prompts_fails_the_check_naming_both_counts(run, source):
    other = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/ckpt-0")
    Evaluation.objects.create(checkpoint=other, status=StageStatus.SUCCEEDED, tau=2.0, num_prompts=60,
                              max_prompts=60, max_new_tokens=48)
    check, _ = serve_check_request(checkpoint=other, user=None, enqueue=False)
    with pytest.raises(ServeCheckRequestError, match=r"measured our τ on 60 prompts of validation conversations, "
                                                     r"which now gives 50"):
        _served(serve_check_plan(check=check))


def test_a_row_from_before_measurements_counted_their_prompts_takes_its_max_prompts(run, source):
    other = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/ckpt-0")
    Evaluation.objects.create(checkpoint=other, status=StageStatus.SUCCEEDED, tau=2.0, max_prompts=7,
                              max_new_tokens=48)
    check, _ = serve_check_request(checkpoint=other, user=None, enqueue=False)
    assert _served(serve_check_plan(check=check)) == SOURCE[:7] and source == [7]
