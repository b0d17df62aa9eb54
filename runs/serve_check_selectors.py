"""Reads of serve checks (runs.job_models.ServeCheck) for the pages, the API and the command line."""
from __future__ import annotations

from runs.job_models import ServeCheck
from runs.models import Checkpoint

SERVE_CHECK_FIELDS = (
    "status", "tau", "vllm_tau", "vllm_tau_emitted", "tau_difference", "vllm_acceptance_per_position",
    "vllm_output_matches_greedy", "mismatched_prompts", "vllm_tokens_per_s_with", "vllm_tokens_per_s_without",
    "vllm_speedup", "vllm_drafts", "vllm_accepted_tokens", "num_prompts", "max_new_tokens", "num_speculative_tokens",
    "dtype", "tensor_parallel_size", "vllm_version", "vllm_build", "command", "error", "log_tail",
)


def serve_check_dict(check: ServeCheck | None) -> dict:
    """A check as JSON: vLLM's figures beside ours, and whether they disagree."""
    if check is None:
        return {"serve_check_id": None}
    return {"serve_check_id": check.pk, **{key: getattr(check, key) for key in SERVE_CHECK_FIELDS},
            "disagrees": check.disagrees}


def serve_check_line(check: ServeCheck) -> str:
    """One sentence for people: both τ, the text, the speeds."""
    ours = "not measured" if check.tau is None else f"{check.tau:.3f}"
    text = "the same text as the target alone" if check.vllm_output_matches_greedy else (
        f"a DIFFERENT text from the target alone on {len(check.mismatched_prompts)} prompt(s)")
    line = (f"vLLM {check.vllm_version} ({check.vllm_build} build): tau {check.vllm_tau_emitted:.3f} on emitted tokens "
            f"(its counters: {check.vllm_tau:.3f}), ours {ours}; {text}; {check.vllm_tokens_per_s_with:,.1f} tokens/s "
            f"with the draft, {check.vllm_tokens_per_s_without:,.1f} without")
    if check.disagrees:
        line += f"; vLLM's tau and ours differ by {check.tau_difference:+.3f}, more than 0.05"
    return line


def checkpoint_serve_checks(checkpoint: Checkpoint, *, limit: int = 10) -> list[ServeCheck]:
    return list(checkpoint.serve_checks.select_related("requested_by", "evaluation")[:limit])
