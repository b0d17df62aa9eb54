"""/api/v1/checkpoints/<id>/generations/: the replies a checkpoint's latest measurement decoded, token by
token, with the draft position that proposed each (runs.checkpoints.generation_selectors)."""
from __future__ import annotations

import math

from rest_framework.response import Response

from runs.api.base import ApiInputError, ApiView
from runs.checkpoints.generation_selectors import GenerationFilter, checkpoint_generations
from runs.pipeline import selectors
from runs.projects import selectors as project_selectors

FILTER_PARAMS = {"prompt_tokens_min": int, "prompt_tokens_max": int, "tau_min": float, "tau_max": float}


def generation_filter(params) -> GenerationFilter:
    """The query's bounds; a bound that is not a finite number of its kind is refused naming it."""
    unknown = sorted(set(params) - set(FILTER_PARAMS))
    if unknown:
        raise ApiInputError(f"unknown parameter {unknown[0][:40]!r} (known: {', '.join(FILTER_PARAMS)})",
                            field=unknown[0][:40])
    bounds = {}
    for name, kind in FILTER_PARAMS.items():
        text = params.get(name, "").strip()
        if not text:
            continue
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < 0:
            noun = "a whole number" if kind is int else "a number"
            raise ApiInputError(f"{name} must be {noun} from 0, got {text[:20]!r}", field=name)
        bounds[name] = value
    return GenerationFilter(**bounds)


class CheckpointGenerations(ApiView):
    query_params = {"GET": [
        ("prompt_tokens_min", "integer", "only prompts of at least this many tokens"),
        ("prompt_tokens_max", "integer", "only prompts of at most this many tokens"),
        ("tau_min", "number", "only prompts whose own τ is at least this"),
        ("tau_max", "number", "only prompts whose own τ is at most this")]}
    responses = {"GET": {"200": "{checkpoint, label, evaluation, tau, num_speculative_tokens, tokens_cap, prompts_cap, "
                                "prompts_total, prompts: [{index, prompt_tokens, prompt_sha256, prompt_tail, tau, "
                                "verify_forwards, new_tokens, matches_greedy, tokens_cut, tokens: [{text, id, "
                                "proposed_at, accepted, verify_step, rejected}]}]}; evaluation null and no prompts "
                                "where no measurement recorded its replies"}}

    def get(self, request, pk: int):
        """The replies of the checkpoint's latest measurement, token by token: `proposed_at` is the draft
        position (1..k) that proposed the token, null where the target chose it (the prefill's token, a
        correction, whose `rejected` is the draft token it replaced, or the bonus token after k accepted
        drafts); `verify_step` is the verification forward that emitted it (0: the prefill). A prompt's `tau`
        counts its whole reply; replies are cut at `tokens_cap` tokens (`tokens_cut`), prompts at
        `prompts_cap`. `prompt_sha256` matches a prompt across checkpoints."""
        project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the caller's projects
        checkpoint = selectors.checkpoint_get(pk=pk)
        keep = generation_filter(request.query_params)
        return Response(checkpoint_generations(checkpoint=checkpoint, keep=keep))
