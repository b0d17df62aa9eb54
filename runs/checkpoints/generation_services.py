"""Writes of a measurement's replies token by token (runs.checkpoints.models.CheckpointGenerations), as the
evaluate stage's worker hands them over with its result (workers.stages.evaluate.generations)."""
from __future__ import annotations

from runs.checkpoints.models import CheckpointGenerations, Evaluation


def generations_record(*, evaluation: Evaluation, generations: dict | None) -> CheckpointGenerations | None:
    """The replies of `evaluation` (its checkpoint's), replacing any recorded for it before; nothing where
    the worker recorded none (a target without a tokenizer, or a result from before generations)."""
    if not generations or not generations.get("prompts") or evaluation.checkpoint_id is None:
        return None
    row, _ = CheckpointGenerations.objects.update_or_create(evaluation=evaluation, defaults={
        "checkpoint_id": evaluation.checkpoint_id,
        "num_speculative_tokens": int(generations["num_speculative_tokens"]),
        "tokens_cap": int(generations["tokens_cap"]),
        "prompts_cap": int(generations["prompts_cap"]),
        "prompts": generations["prompts"],
    })
    return row
