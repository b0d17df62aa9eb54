"""Reads of a checkpoint's generations (runs.checkpoints.models.CheckpointGenerations) for the API and the
checkpoint page: the latest measurement's replies, a token per object, filtered by prompt length and τ."""
from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, Q

from runs.checkpoints.models import Checkpoint, CheckpointGenerations
from runs.pipeline.models import PipelineRun
from runs.projects.access import runs_visible

# The checkpoints offered to compare with on a checkpoint's page, its own run's first.
COMPARE_CHOICES = 100


@dataclass(frozen=True)
class GenerationFilter:
    """Bounds, each inclusive and optional, on a prompt's length in tokens and on its τ."""

    prompt_tokens_min: int | None = None
    prompt_tokens_max: int | None = None
    tau_min: float | None = None
    tau_max: float | None = None

    def keeps(self, prompt: dict) -> bool:
        n, tau = prompt["prompt_tokens"], prompt["tau"]
        return ((self.prompt_tokens_min is None or n >= self.prompt_tokens_min)
                and (self.prompt_tokens_max is None or n <= self.prompt_tokens_max)
                and (self.tau_min is None or tau >= self.tau_min)
                and (self.tau_max is None or tau <= self.tau_max))


def _tokens(prompt: dict) -> list[dict]:
    """The stored columns (workers.stages.evaluate.generations) as one object per token. A token is
    `accepted` when the draft proposed it and the target kept it; the target's own tokens (the prefill's,
    corrections, bonus tokens) have no `proposed_at`, and a correction names the draft token it replaced
    and that token's draft position (one past the drafts its forward accepted)."""
    tokens = []
    for token_id, text, at, step, rejected_id, rejected_text in zip(
            prompt["ids"], prompt["texts"], prompt["proposed_at"], prompt["verify_step"], prompt["rejected_ids"],
            prompt["rejected_texts"]):
        rejected = None
        if rejected_id is not None:
            before = tokens[-1] if tokens and tokens[-1]["verify_step"] == step else None
            position = (before["proposed_at"] or 0) + 1 if before else 1
            rejected = {"id": rejected_id, "text": rejected_text, "position": position}
        tokens.append({"text": text, "id": token_id, "proposed_at": at, "accepted": at is not None,
                       "verify_step": step, "rejected": rejected})
    return tokens


def _prompt_dict(prompt: dict) -> dict:
    keys = ("index", "prompt_tokens", "prompt_sha256", "prompt_tail", "prompt_cut", "tau", "verify_forwards",
            "new_tokens", "matches_greedy", "tokens_cut")
    return {**{key: prompt[key] for key in keys}, "tokens": _tokens(prompt)}


def checkpoint_label(checkpoint: Checkpoint) -> str:
    """For people: epochs counted from 1, as every page counts them (the API's `epoch` is the trainer's, from 0)."""
    if checkpoint.training_run_id is None:
        return f"#{checkpoint.pk} imported"
    return f"#{checkpoint.pk} epoch {checkpoint.epoch + 1} of {checkpoint.training_run.run}"


def checkpoint_generations(*, checkpoint: Checkpoint, keep: GenerationFilter | None = None) -> dict:
    """The replies of the checkpoint's latest measurement that recorded them, the prompts `keep` keeps;
    `evaluation` None and no prompts where none did."""
    row = (CheckpointGenerations.objects.filter(checkpoint=checkpoint).select_related("evaluation")
           .order_by(F("evaluation__finished_at").desc(nulls_last=True), "-id").first())
    answer = {"checkpoint": checkpoint.pk, "label": checkpoint_label(checkpoint), "evaluation": None, "tau": None,
              "num_speculative_tokens": None, "tokens_cap": None, "prompts_cap": None, "prompts_total": 0,
              "prompts": []}
    if row is None:
        return answer
    keep = keep or GenerationFilter()
    return {**answer, "evaluation": row.evaluation_id, "tau": row.evaluation.tau,
            "num_speculative_tokens": row.num_speculative_tokens, "tokens_cap": row.tokens_cap,
            "prompts_cap": row.prompts_cap, "prompts_total": len(row.prompts),
            "prompts": [_prompt_dict(p) for p in row.prompts if keep.keeps(p)]}


def compare_choices(*, checkpoint: Checkpoint, user: AbstractBaseUser) -> list[dict]:
    """Other checkpoints with recorded generations, {id, label}: imported ones and those of runs in projects
    the user sees (runs.projects.access), the checkpoint's own run's first, then the newest."""
    visible_runs = runs_visible(PipelineRun.objects.all(), user).values("pk")
    measured = (Checkpoint.objects.filter(generations__isnull=False).exclude(pk=checkpoint.pk)
                .filter(Q(training_run__isnull=True) | Q(training_run__run__in=visible_runs)).distinct()
                .select_related("training_run__run").order_by("-pk")[:COMPARE_CHOICES])
    own_run = checkpoint.training_run.run_id if checkpoint.training_run_id else None
    ordered = sorted(measured, key=lambda c: (c.training_run_id is None or c.training_run.run_id != own_run, -c.pk))
    return [{"id": c.pk, "label": checkpoint_label(c)} for c in ordered]
