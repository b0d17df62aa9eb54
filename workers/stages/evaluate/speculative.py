"""Greedy speculative decoding against a transformers target, and what it measures.

A proposer suggests a chain of k tokens; one target forward verifies them, and the longest prefix
that equals the target's own greedy choice is kept plus the target's next token. The evaluate stage
(workers/stages/evaluate/measure.py) proposes with an EAGLE-3 draft; tests propose with stand-ins whose
acceptance is known in advance (tests/stages/evaluate/test_tau_known_answers.py).

tau (tokens per target forward) counts only tokens that reach the output: a verification forward's
accepted count is the number of tokens it contributed to the output after the max_new_tokens and EOS
cuts, less one, so tau = (output tokens after the prefill's first) / verification forwards. The
prefill forward, which every decoder pays once per prompt, is not counted. Acceptance at draft
position i is the share of verification forwards whose first i+1 drafted tokens were all emitted,
so tau = 1 + sum(acceptance_per_position).

Each prompt's reply is also traced token by token (token_trace): the verification forward that emitted
it (0: the prefill) and the draft position that proposed it, or none where the target chose it (a
correction, with the draft token it replaced, or the bonus token after k accepted drafts).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from workers.contract.acceptance import tau_from_accepted
from workers.contract.errors import StopRequested


class EvaluationStopped(StopRequested):
    """should_stop() asked the evaluation to end."""


class Proposer(Protocol):
    """What speculative_decode asks for draft tokens; one per prompt."""

    def extend(self, aux: torch.Tensor, next_tokens: list[int]) -> None:
        """The target's aux features ([n, L*H]) for positions now confirmed, and the token that
        follows each of them."""

    def propose(self, k: int) -> list[int]:
        """k target token ids to continue the confirmed sequence with."""


@dataclass(frozen=True)
class PromptResult:
    prompt_tokens: int
    new_tokens: int
    verify_forwards: int
    accepted: list[int]  # per verification forward: its tokens in the output, less one
    matches_greedy: bool
    # The reply traced token by token (token_trace), one entry per output token.
    tokens: list[int] = field(default_factory=list)
    proposed_at: list[int | None] = field(default_factory=list)
    verify_step: list[int] = field(default_factory=list)
    rejected: list[int | None] = field(default_factory=list)


@dataclass(frozen=True)
class Measurement:
    prompts: list[PromptResult]
    tau: float
    acceptance_per_position: list[float]
    new_tokens: int
    verify_forwards: int
    mismatched_prompts: list[int]
    spec_seconds: float
    greedy_seconds: float


class TargetRunner:
    """The target with a KV cache and hooks that keep its inputs to the draft's aux layers.

    `device`: where its inputs go and where the aux features are returned, the draft's device (the
    model's own when not given). A target spread over GPUs (device_map) takes its inputs on cuda:0 and
    hands back its logits there, but each hooked layer's input lies on that layer's GPU: the aux
    features are moved to `device`, where the draft reads them."""

    def __init__(self, model, aux_layer_ids: list[int], *, device: torch.device | None = None):
        from workers.stages.extract.model import LayerCapture

        self.model = model
        self.device = device if device is not None else model.device
        self.capture = LayerCapture(model, aux_layer_ids)

    def forward(self, token_ids: list[int], cache) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [n, V], aux features [n, L*H] on `device`) for the new tokens."""
        ids = torch.tensor([token_ids], device=self.device)
        logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0]
        aux = self.capture.stacked()[0].to(self.device)
        return logits, aux.flatten(1)

    def close(self) -> None:
        self.capture.remove()


def eos_ids(model) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _finish(tokens: list[int], max_new: int, eos: set[int]) -> list[int]:
    tokens = tokens[:max_new]
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def emitted_accepted(contributed: list[int], emitted: int) -> list[int]:
    """Accepted draft tokens per verification forward, counting only what reached the output:
    `contributed` are the tokens each forward added after the prefill's first, `emitted` the output's
    length after the cuts. Every forward ran while the output was still open, so each emitted at
    least its first token."""
    accepted, start = [], 1  # the prefill forward gave output token 0
    for n in contributed:
        accepted.append(min(n, emitted - start) - 1)
        start += n
    return accepted


def token_trace(steps: list[tuple[list[int], int]], n: int) -> tuple[list[int | None], list[int], list[int | None]]:
    """Per output token (the first `n`): the draft position (1..k) that proposed it, or None where the
    target chose it; its verification forward (0: the prefill's token); and, where the target's token
    replaced a draft, that rejected draft token. `steps`: each verification forward's drafts and how many
    of them the target accepted, as speculative_decode records them before the output's cuts."""
    proposed_at: list[int | None] = [None]
    verify_step, rejected = [0], [None]
    for step, (drafts, accepted) in enumerate(steps, start=1):
        proposed_at += [*range(1, accepted + 1), None]
        verify_step += [step] * (accepted + 1)
        rejected += [None] * accepted + [drafts[accepted] if accepted < len(drafts) else None]
    return proposed_at[:n], verify_step[:n], rejected[:n]


@torch.inference_mode()
def greedy_decode(model, prompt: list[int], *, max_new_tokens: int, eos: set[int],
                  device: torch.device | None = None) -> list[int]:
    """Plain greedy decoding of the target, one token per forward, with a KV cache. `device`: where its
    inputs go (cuda:0 for a target spread over GPUs), the model's own when not given."""
    from transformers import DynamicCache

    device = device if device is not None else model.device
    cache = DynamicCache()
    ids = torch.tensor([prompt], device=device)
    out: list[int] = []
    while True:
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
        token = int(torch.argmax(logits))
        out.append(token)
        if token in eos or len(out) >= max_new_tokens:
            return out
        ids = torch.tensor([[token]], device=device)


@torch.inference_mode()
def speculative_decode(target: TargetRunner, proposer: Proposer, prompt: list[int], *, k: int, max_new_tokens: int,
                       eos: set[int], steps: list[tuple[list[int], int]] | None = None) -> tuple[list[int], list[int]]:
    """Greedy speculative decoding with a chain of k proposed tokens; (tokens, accepted per
    verification forward, counting only emitted tokens). `steps`, when given, gets each verification
    forward's drafts and how many of them were accepted (token_trace reads them)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    logits, aux = target.forward(prompt, cache)
    out = [int(torch.argmax(logits[-1]))]
    proposer.extend(aux, prompt[1:] + out)
    contributed: list[int] = []
    while len(out) < max_new_tokens and not eos.intersection(out):
        drafts = proposer.propose(k)
        logits, aux = target.forward([out[-1], *drafts], cache)
        choices = torch.argmax(logits, dim=-1).tolist()
        accepted = 0
        while accepted < k and drafts[accepted] == choices[accepted]:
            accepted += 1
        new = drafts[:accepted] + [choices[accepted]]
        contributed.append(len(new))
        if steps is not None:
            steps.append((list(drafts), accepted))
        if accepted < k:
            cache.crop(-(k - accepted))  # the target's entries for rejected drafts
        proposer.extend(aux[: accepted + 1], new)
        out.extend(new)
    tokens = _finish(out, max_new_tokens, eos)
    return tokens, emitted_accepted(contributed, len(tokens))


def measure(model, prompts: list[list[int]], *, aux_layer_ids: list[int], new_proposer: Callable[[list[int]], Proposer],
            k: int, max_new_tokens: int, eos: set[int], device: torch.device | None = None,
            on_progress: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> Measurement:
    """Decode every prompt greedily and speculatively (a fresh proposer from `new_proposer(prompt)`
    each); tau and acceptance over all verification forwards, and whether the texts are equal."""
    target = TargetRunner(model, aux_layer_ids, device=device)
    results, spec_s, greedy_s = [], 0.0, 0.0
    try:
        for n, prompt in enumerate(prompts):
            if should_stop is not None and should_stop():
                raise EvaluationStopped(f"evaluation stopped on request after {n} prompts")
            t0 = time.perf_counter()
            reference = greedy_decode(model, prompt, max_new_tokens=max_new_tokens, eos=eos, device=device)
            t1 = time.perf_counter()
            steps: list[tuple[list[int], int]] = []
            tokens, accepted = speculative_decode(target, new_proposer(prompt), prompt, k=k,
                                                  max_new_tokens=max_new_tokens, eos=eos, steps=steps)
            t2 = time.perf_counter()
            greedy_s, spec_s = greedy_s + (t1 - t0), spec_s + (t2 - t1)
            proposed_at, verify_step, rejected = token_trace(steps, len(tokens))
            results.append(PromptResult(prompt_tokens=len(prompt), new_tokens=len(tokens),
                                        verify_forwards=len(accepted), accepted=accepted,
                                        matches_greedy=tokens == reference, tokens=tokens, proposed_at=proposed_at,
                                        verify_step=verify_step, rejected=rejected))
            if on_progress is not None:
                on_progress(n + 1, len(prompts))
    finally:
        target.close()
    return measurement_of(results, k=k, spec_seconds=spec_s, greedy_seconds=greedy_s)


def measurement_of(results: list[PromptResult], *, k: int, spec_seconds: float, greedy_seconds: float) -> Measurement:
    """τ, acceptance and the rest over every prompt's result, in prompt order: one worker's measure(), or
    a sharded evaluation's parts put together (workers/stages/evaluate/merge.py), the same sums either way."""
    accepted_all = [a for r in results for a in r.accepted]
    tau, per_position = tau_from_accepted(accepted_all, k)
    return Measurement(prompts=results, tau=tau, acceptance_per_position=per_position,
                       new_tokens=sum(r.new_tokens for r in results), verify_forwards=len(accepted_all),
                       mismatched_prompts=[i for i, r in enumerate(results) if not r.matches_greedy],
                       spec_seconds=spec_seconds, greedy_seconds=greedy_seconds)
