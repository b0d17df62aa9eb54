"""Serve checks (runs.pipeline.jobs.models.ServeCheck): asking for one, what it serves, and recording what vLLM said.

A serve check compares vLLM's τ with ours on the same prompts, so it follows an evaluation of the
checkpoint: its prompts, its max_new_tokens, its proposal length, its τ. Asking while a check of the
same checkpoint and evaluation is queued or running returns that one.

The prompts are the evaluation's source cut at the count it measured (`num_prompts`), not at its
max_prompts: both sources are read in a fixed order, so the first num_prompts are the very list our τ
came from, even for a row whose max_prompts was never set to what it measured (the pipeline's
measurements of a run's other checkpoints, before they recorded it). The list's count and sha256 are
stored with the result (ServeCheck.prompts_count, prompts_sha256)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.checkpoints.evaluation import evaluation_plan
from runs.pipeline.jobs.models import ServeCheck
from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.launch.setting_bounds import DEFAULT_SERVE_CONCURRENCY
from runs.pipeline.launch.setting_checks import check_serve_concurrency
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.dispatch.queue import job_enqueue, pending_enqueue
from runs.roles import require
from workers.contract.errors import InputError
from workers.contract.chats.prompt_source import PromptSource

PENDING = (StageStatus.QUEUED, StageStatus.RUNNING)


class ServeCheckRequestError(InputError):
    pass


def _compared_evaluation(checkpoint: Checkpoint) -> Evaluation:
    evaluation = checkpoint.evaluations.filter(status=StageStatus.SUCCEEDED, tau__isnull=False).order_by("-id").first()
    if evaluation is None:
        raise ServeCheckRequestError(
            f"checkpoint {checkpoint.pk} has no finished measurement of its acceptance length: measure it first, "
            "the serve check compares vLLM's τ with ours on the same prompts")
    return evaluation


@transaction.atomic
def serve_check_request(*, checkpoint: Checkpoint, user: AbstractBaseUser | None,
                        evaluation: Evaluation | None = None, enqueue: bool = True,
                        concurrency: list[int] | None = None) -> tuple[ServeCheck, bool]:
    """(the check, whether it is new): a pending check of the same checkpoint and evaluation is
    returned (handed to the broker again unless it waits in the outbox), else one is queued. Its load's
    levels: `concurrency`, else the run's serve_concurrency, else the default (1, 8, 32)."""
    if user is not None:
        require(user, "launch")
    Checkpoint.objects.select_for_update().filter(pk=checkpoint.pk).first()  # one request at a time per checkpoint
    evaluation = evaluation or _compared_evaluation(checkpoint)
    pending = checkpoint.serve_checks.filter(evaluation=evaluation, status__in=PENDING).first()
    if pending is not None:
        if enqueue and pending.status == StageStatus.QUEUED and pending_enqueue(kind="serve_check",
                                                                                object_id=pending.pk) is None:
            job_enqueue(job_name="serve_check", record_id=pending.pk)  # the broker may have lost its message
        return pending, False
    run = checkpoint.training_run.run if checkpoint.training_run_id is not None else None
    config = (run.config or {}) if run is not None else {}
    # A target vLLM extracted from on n GPUs is served on n; otherwise on one device.
    gpus = int(config.get("tensor_parallel_size") or 1) if config.get("extraction_backend") == "vllm" else 1
    levels = check_serve_concurrency(concurrency if concurrency is not None else
                                     config.get("serve_concurrency") or list(DEFAULT_SERVE_CONCURRENCY))
    check = ServeCheck.objects.create(checkpoint=checkpoint, evaluation=evaluation, requested_by=user,
                                      concurrency=levels,
                                      tensor_parallel_size=gpus, max_new_tokens=evaluation.max_new_tokens,
                                      num_speculative_tokens=evaluation.num_speculative_tokens)
    if enqueue:
        job_enqueue(job_name="serve_check", record_id=check.pk)
    return check, True


@dataclass(frozen=True)
class ServeCheckPlan:
    check_id: int
    evaluation_id: int
    target_dir: Path
    checkpoint_dir: Path
    prompts: PromptSource  # loaded on the worker (workers.stages.evaluate.prompts.prompts_load)
    prompt_source: str
    measured: int | None  # how many prompts the compared measurement decoded
    max_new_tokens: int
    num_speculative_tokens: int | None
    concurrency: list[int]  # the load's levels (workers.stages.evaluate.serve_load)

    def prompts_checked(self, loaded: list[list[int]]) -> list[list[int]]:
        """The loaded prompts, refused when they are not as many as the measurement decoded."""
        if self.measured is not None and len(loaded) != self.measured:
            raise ServeCheckRequestError(
                f"serve check {self.check_id}: evaluation {self.evaluation_id} measured our τ on {self.measured} "
                f"prompts of {self.prompt_source}, which now gives {len(loaded)}; comparing on other prompts would "
                "compare nothing, so measure the checkpoint again and check that measurement")
        return loaded


def serve_check_plan(*, check: ServeCheck) -> ServeCheckPlan:
    """What the check serves: its evaluation's checkpoint, target and the prompts it measured."""
    evaluation = check.evaluation
    if evaluation is None:
        raise ServeCheckRequestError(f"serve check {check.pk}: the measurement it compares with was deleted; ask again")
    measured = evaluation.num_prompts  # None only on a row from before measurements counted their prompts
    plan = evaluation_plan(evaluation=evaluation, limit=measured)
    return ServeCheckPlan(check_id=check.pk, evaluation_id=evaluation.pk, target_dir=plan.target_dir,
                          checkpoint_dir=Path(check.checkpoint.path), prompts=plan.prompts,
                          prompt_source=plan.prompt_source, measured=measured,
                          max_new_tokens=evaluation.max_new_tokens,
                          num_speculative_tokens=evaluation.num_speculative_tokens,
                          concurrency=list(check.concurrency or DEFAULT_SERVE_CONCURRENCY))
