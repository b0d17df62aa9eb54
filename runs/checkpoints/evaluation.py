"""Measuring a checkpoint's acceptance length: ask for it, and work out what to decode."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.data.paths import check_under_data_roots
from runs.pipeline.dispatch.queue import evaluation_enqueue
from runs.roles import require
from workers.contract.errors import InputError
from workers.contract.chats.prompt_source import PromptSource, validation_rows

MAX_PROMPTS_LIMIT = 1000
MAX_NEW_TOKENS_LIMIT = 4096


class EvaluationRequestError(InputError):
    pass


@dataclass(frozen=True)
class EvaluationPlan:
    checkpoint_dir: Path
    target_dir: Path
    prompt_source: str
    prompts: PromptSource  # loaded on the worker, where the tokenizer lives (workers.stages.evaluate.prompts)
    # The pipeline's stage also measures the run's other checkpoints on the same prompts, so that
    # every checkpoint a run registers shows a measured tau.
    also: list[tuple[int, Path]] = field(default_factory=list)
    checkpoint_id: int | None = None
    # The run's evaluation suites, {name: chat file} (runs.data.suites), each measured on every checkpoint too.
    suites: dict[str, PromptSource] = field(default_factory=dict)
    # Every checkpoint of the run, measured on each suite (`also` leaves out those live τ already measured on
    # the held-out prompts; no live measurement covers a suite).
    suite_checkpoints: list[tuple[int, Path]] = field(default_factory=list)


def _trained_here(checkpoint: Checkpoint) -> bool:
    """Trained by a pipeline run here, whose prepared validation conversations it can be measured on
    (not imported, nor reported by a run trained elsewhere)."""
    return checkpoint.training_run_id is not None and not checkpoint.training_run.run.external


def _target_dir(checkpoint: Checkpoint) -> Path:
    if checkpoint.training_run_id is not None and checkpoint.training_run.run.target_id is not None:
        # Confined again (runs.data.paths): a file linked out of the data roots since the launch is refused.
        return check_under_data_roots(checkpoint.training_run.run.target.path, kind="the run's target directory")
    if not checkpoint.verifier_path:
        raise EvaluationRequestError(f"checkpoint {checkpoint.pk} names no verifier, so there is no target to decode with")
    return check_under_data_roots(checkpoint.verifier_path, kind="the checkpoint's verifier directory")


def evaluation_plan(*, evaluation: Evaluation, limit: int | None = None) -> EvaluationPlan:
    """The checkpoint (for the pipeline's stage: the run's best), its target and its prompts: the first
    `limit` (default: the evaluation's max_prompts) of its source, in the source's order."""
    checkpoint = evaluation.checkpoint
    also = []
    if evaluation.run_id is not None:
        # Those measured alike while training (live τ, runs.pipeline.status.live_tau) are not measured again.
        measured = Evaluation.objects.filter(
            checkpoint__training_run__run_id=evaluation.run_id, status=StageStatus.SUCCEEDED, tau__isnull=False,
            prompts_path=evaluation.prompts_path, max_prompts=evaluation.max_prompts,
            max_new_tokens=evaluation.max_new_tokens).values_list("checkpoint_id", flat=True)
        also = [(c.pk, Path(c.path)) for c in Checkpoint.objects.filter(training_run__run_id=evaluation.run_id,
                                                                          is_best=False).exclude(pk__in=measured)
                .order_by("epoch")]
    if checkpoint is None:
        run = evaluation.run
        checkpoint = Checkpoint.objects.filter(training_run__run=run, is_best=True).select_related(
            "training_run__run__target").first()
        if checkpoint is None:
            raise EvaluationRequestError(f"{run} has no best checkpoint to evaluate: did training finish?")
        Evaluation.objects.filter(pk=evaluation.pk).update(checkpoint=checkpoint)
    target_dir = _target_dir(checkpoint)
    limit = evaluation.max_prompts if limit is None else limit
    if evaluation.prompts_path:
        path = Path(evaluation.prompts_path)
        return EvaluationPlan(Path(checkpoint.path), target_dir, str(path),
                              PromptSource(kind="file", path=path, limit=limit, tokenizer_dir=target_dir),
                              checkpoint_id=checkpoint.pk)
    if not _trained_here(checkpoint):
        raise EvaluationRequestError(
            f"checkpoint {checkpoint.pk} was not trained here, so it has no validation conversations; give a prompts file")
    run = checkpoint.training_run.run
    prepared = Path(run.preparation.out_dir)
    rows = validation_rows(Path(checkpoint.path).parent)
    source = f"validation conversations of {run} ({prepared})"
    # Confined again at the stage: a suite's file linked out of the data roots since the launch is refused.
    suites = {name: PromptSource(kind="file", path=check_under_data_roots(path, kind=f"eval suite {name}'s file"),
                                 limit=limit, tokenizer_dir=target_dir)
              for name, path in ((run.config or {}).get("eval_suites") or {}).items()} if evaluation.run_id else {}
    return EvaluationPlan(Path(checkpoint.path), target_dir, source,
                          PromptSource(kind="prepared", path=prepared, limit=limit, row_indices=tuple(rows)), also,
                          checkpoint_id=checkpoint.pk, suites=suites,
                          suite_checkpoints=[(c.pk, Path(c.path)) for c in Checkpoint.objects.filter(
                              training_run__run_id=evaluation.run_id).order_by("epoch")] if suites else [])


@transaction.atomic
def evaluation_request(
    *,
    checkpoint: Checkpoint,
    user: AbstractBaseUser,
    prompts_path: str | None = None,
    max_new_tokens: int = 64,
    max_prompts: int = 32,
    num_speculative_tokens: int | None = None,
    enqueue: bool = True,
) -> tuple[Evaluation, bool]:
    """Record an evaluation of `checkpoint` and, after commit, hand it to a GPU worker; (it, True).
    While one with the same settings is queued or running: (that one, False), and nothing new."""
    require(user, "launch")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise EvaluationRequestError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    if not 1 <= max_prompts <= MAX_PROMPTS_LIMIT:
        raise EvaluationRequestError(f"max_prompts must be between 1 and {MAX_PROMPTS_LIMIT}, got {max_prompts}")
    if num_speculative_tokens is not None and not 1 <= num_speculative_tokens <= 16:
        raise EvaluationRequestError(f"num_speculative_tokens must be between 1 and 16, got {num_speculative_tokens}")
    prompts = ""
    if prompts_path:
        resolved = check_under_data_roots(prompts_path, kind="prompts file")
        if not resolved.is_file():
            raise EvaluationRequestError(f"prompts file {resolved} is not a file (give a .jsonl chat file)")
        prompts = str(resolved)
    elif not _trained_here(checkpoint):
        raise EvaluationRequestError(
            f"checkpoint {checkpoint.pk} was not trained here, so it has no validation conversations; give a prompts file")
    _target_dir(checkpoint)
    settings = dict(prompts_path=prompts, max_new_tokens=max_new_tokens, max_prompts=max_prompts,
                    num_speculative_tokens=num_speculative_tokens)
    # Requests for one checkpoint take turns here, so that two at once (a double click) cannot both
    # find nothing pending and both create one.
    Checkpoint.objects.select_for_update().filter(pk=checkpoint.pk).first()
    pending = Evaluation.objects.filter(checkpoint=checkpoint, status__in=(StageStatus.QUEUED, StageStatus.RUNNING),
                                        **settings).order_by("id").first()
    if pending is not None:
        return pending, False
    evaluation = Evaluation.objects.create(checkpoint=checkpoint, requested_by=user, **settings)
    if enqueue:
        evaluation_enqueue(evaluation_id=evaluation.pk)
    return evaluation, True
