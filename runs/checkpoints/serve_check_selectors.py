"""Reads of serve checks (runs.pipeline.jobs.models.ServeCheck) for the pages, the API and the command line."""
from __future__ import annotations

from runs.pipeline.jobs.models import ServeCheck
from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.lifecycle.failure_selectors import failure_fields

SERVE_CHECK_FIELDS = (  # the speed-up first: on a GPU it is what users buy a draft for
    "vllm_speedup", "status", "tau", "vllm_tau", "vllm_tau_emitted", "tau_difference", "vllm_acceptance_per_position",
    "vllm_output_matches_greedy", "mismatched_prompts", "vllm_tokens_per_s_with", "vllm_tokens_per_s_without",
    "vllm_drafts", "vllm_decode_steps", "vllm_accepted_tokens", "vllm_replies_cut", "num_prompts", "prompts_count",
    "prompts_sha256", "max_new_tokens", "num_speculative_tokens",
    "dtype", "tensor_parallel_size", "vllm_version", "vllm_build", "command", "error",
    "concurrency", "concurrency_results",  # the speed-up at each concurrency (workers.stages.evaluate.serve_load)
)


def serve_check_dict(check: ServeCheck | None) -> dict:
    """A check as JSON: vLLM's figures beside ours, and whether they disagree."""
    if check is None:
        return {"serve_check_id": None}
    return {"serve_check_id": check.pk, **{key: getattr(check, key) for key in SERVE_CHECK_FIELDS},
            "disagrees": check.disagrees, **failure_fields(check)}


def serve_check_line(check: ServeCheck) -> str:
    """One sentence for people: both τ, the text, the speeds."""
    ours = "not measured" if check.tau is None else f"{check.tau:.3f}"
    text = "the same text as the target alone" if check.vllm_output_matches_greedy else (
        f"a DIFFERENT text from the target alone on {len(check.mismatched_prompts)} prompt(s)")
    prompts = f"{check.prompts_count} prompts, sha256 {check.prompts_sha256[:12]}" if check.prompts_sha256 else (
        f"{check.num_prompts} prompts")
    line = (f"vLLM {check.vllm_version} ({check.vllm_build} build) with the draft on {prompts}: "
            f"{check.vllm_speedup:.2f}x the tokens/s of the target alone ({check.vllm_tokens_per_s_with:,.1f} against "
            f"{check.vllm_tokens_per_s_without:,.1f}); tau {check.vllm_tau_emitted:.3f} on emitted tokens (its counters: "
            f"{check.vllm_tau:.3f}), ours {ours}; {text}")
    if check.concurrency_results:
        levels = ", ".join(f"{r['concurrency']}: {r['speedup']:.2f}x ({r['tokens_per_s_with']:,.1f} against "
                           f"{r['tokens_per_s_without']:,.1f} output tokens/s)" for r in check.concurrency_results)
        where = "CPU figures" if check.concurrency_results[0].get("device") == "cpu" else "GPU figures"
        line += f"; speed-up at concurrency {levels}, {where}"
    if check.disagrees:
        line += f"; vLLM's tau and ours differ by {check.tau_difference:+.3f}, more than 0.05"
    return line


def run_serve_checks_queued(*, run_id: int) -> list[int]:
    """The ids of the queued serve checks of a run's measurement, oldest first."""
    return list(ServeCheck.objects.filter(evaluation__run_id=run_id, status="queued").order_by("id")
                .values_list("pk", flat=True))


def run_serve_check(*, evaluation_id: int | None) -> ServeCheck | None:
    """The latest serve check of a run's measurement."""
    if evaluation_id is None:
        return None
    return ServeCheck.objects.filter(evaluation_id=evaluation_id).order_by("-id").first()


def checkpoint_serve_checks(checkpoint: Checkpoint, *, limit: int = 10) -> list[ServeCheck]:
    return list(checkpoint.serve_checks.select_related("requested_by", "evaluation")[:limit])


def unusable_reasons(checkpoint_ids) -> dict[int, str]:
    """Why each of these checkpoints must not be deployed, for those that must not: its speculative
    output differed from the target's greedy output, in our measurement or in vLLM's. Two queries."""
    reasons: dict[int, str] = {}
    for e in Evaluation.objects.filter(checkpoint_id__in=checkpoint_ids, status=StageStatus.SUCCEEDED,
                                       output_matches_greedy=False).order_by("-id"):
        reasons.setdefault(e.checkpoint_id, f"its speculative output differed from greedy decoding on "
                                            f"{len(e.mismatched_prompts)} prompt(s) when its acceptance was measured "
                                            f"(evaluation {e.pk})")
    for c in ServeCheck.objects.filter(checkpoint_id__in=checkpoint_ids, status=StageStatus.SUCCEEDED,
                                       vllm_output_matches_greedy=False).order_by("-id"):
        reasons.setdefault(c.checkpoint_id, f"vLLM's output with the draft differed from the target's alone on "
                                            f"{len(c.mismatched_prompts)} prompt(s) (serve check {c.pk})")
    return reasons


def checkpoint_usable(checkpoint: Checkpoint) -> tuple[bool, str]:
    """(usable, why not): a draft that changes the text it speeds up must not be deployed."""
    why = unusable_reasons([checkpoint.pk]).get(checkpoint.pk, "")
    return not why, why


def with_usability(checkpoints) -> list[Checkpoint]:
    """The checkpoints, each with `unusable_why` ("" when nothing says it changes the text)."""
    checkpoints = list(checkpoints)
    reasons = unusable_reasons([c.pk for c in checkpoints])
    for checkpoint in checkpoints:
        checkpoint.unusable_why = reasons.get(checkpoint.pk, "")
    return checkpoints
