"""τ and acceptance by position for every k from 1 to a limit, from one probing decode per prompt, and
the k to serve.

Why one decode answers every k exactly. Greedy speculative decoding (workers/stages/evaluate/speculative.py)
emits the target's greedy text whatever k is, so the confirmed prefix at each output position is the same
for every k. From a confirmed prefix the draft's proposals do not depend on k either: chain step s reads
only the context entries (one per confirmed position, built from the target's features there) and the
draft's own steps before s, so asking for k tokens gives the first k of what asking for K >= k gives. So
`probe_decode` stops at every output position p, asks the draft for K = k_max tokens, and records L(p),
how many of them in a row equal the target's choices (one target forward verifying K + 1 positions, as
speculative decoding does). Decoding with k then is a walk: at position p a forward emits min(L(p), k) + 1
tokens and the next forward starts there (`walk`); the output's max_new_tokens and EOS cuts are counted as
speculative_decode counts them (emitted_accepted). tests/stages/evaluate/test_k_table.py checks the walk against a
separate speculative decode at each k with the real draft, and against the oracle and always-wrong
stand-ins' known answers.

The k to serve (`recommend_k`): the most emitted tokens per unit of decoding cost, where one speculative step
costs one target forward (verifying k + 1 positions: at decode time a forward reads the target's weights
once whether it scores 2 positions or 8, so it costs about one forward for small k) plus k draft forwards,
each `draft_cost` of a target forward: the draft's weights over the target's (`draft_cost_ratio`; token
embedding tables are left out of both, a lookup reads one row of them). So tokens per target forward,
τ_k / (1 + draft_cost · k); a tie to TIE_DECIMALS goes to the smaller k."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workers.contract.acceptance import tau_from_accepted
from workers.stages.evaluate.speculative import EvaluationStopped, Proposer, TargetRunner, _finish, emitted_accepted

TIE_DECIMALS = 3
MAX_K = 16  # as num_speculative_tokens is bounded everywhere (runs.checkpoints.evaluation)


@dataclass(frozen=True)
class KRow:
    k: int
    tau: float
    acceptance_per_position: list[float]
    tokens_per_target_forward: float  # τ_k / (1 + draft_cost · k): what recommend_k compares


@dataclass(frozen=True)
class KTable:
    k_max: int
    draft_cost: float
    rows: list[KRow]
    recommended_k: int

    def as_dict(self) -> dict:
        """As the evaluation row keeps it: {"k_max", "draft_cost", "recommended_k", "rows": {k: {...}}}."""
        return {"k_max": self.k_max, "draft_cost": self.draft_cost, "recommended_k": self.recommended_k,
                "rows": {str(r.k): {"tau": r.tau, "acceptance_per_position": r.acceptance_per_position,
                                    "tokens_per_target_forward": r.tokens_per_target_forward} for r in self.rows}}


def k_limit(trained_k: int, beyond: int) -> int:
    """The largest k measured: the draft's trained steps plus `beyond` (EAGLE3WEB_K_BEYOND_TRAINED), at most MAX_K."""
    return max(1, min(MAX_K, trained_k + max(0, beyond)))


@torch.inference_mode()
def probe_decode(target: TargetRunner, proposer: Proposer, prompt: list[int], *, k_max: int, max_new_tokens: int,
                 eos: set[int]) -> tuple[list[int], list[int]]:
    """Greedy decoding one token per forward that, at every output position, asks the draft for k_max tokens
    and verifies them in that forward; (the output after its cuts, L per open position: the drafts in a row
    that equal the target's choices). lengths[p - 1] belongs to the state with p output tokens."""
    from transformers import DynamicCache

    cache = DynamicCache()
    logits, aux = target.forward(prompt, cache)
    out = [int(torch.argmax(logits[-1]))]
    proposer.extend(aux, prompt[1:] + out)
    lengths: list[int] = []
    while len(out) < max_new_tokens and not eos.intersection(out):
        drafts = proposer.propose(k_max)
        logits, aux = target.forward([out[-1], *drafts], cache)
        choices = torch.argmax(logits, dim=-1).tolist()
        run = 0
        while run < k_max and drafts[run] == choices[run]:
            run += 1
        lengths.append(run)
        cache.crop(-k_max)  # keep the confirmed token's entry only: the next position is probed afresh
        proposer.extend(aux[:1], [choices[0]])
        out.append(choices[0])
    return _finish(out, max_new_tokens, eos), lengths


def walk(lengths: list[int], emitted: int, k: int) -> list[int]:
    """Accepted draft tokens per verification forward of a speculative decode with k, from probe_decode's
    lengths and the output's length after its cuts (counted as speculative_decode counts them)."""
    contributed, position = [], 1  # the prefill emitted the first token
    while position < emitted:
        step = min(lengths[position - 1], k) + 1
        contributed.append(step)
        position += step
    return emitted_accepted(contributed, emitted)


def recommend_k(taus: dict[int, float], draft_cost: float) -> tuple[int, dict[int, float]]:
    """(the k with the most tokens per target forward, that figure for each k)."""
    per_forward = {k: tau / (1.0 + draft_cost * k) for k, tau in taus.items()}
    best = min(per_forward, key=lambda k: (-round(per_forward[k], TIE_DECIMALS), k))
    return best, per_forward


def draft_cost_ratio(draft: torch.nn.Module, target: torch.nn.Module) -> float:
    """The draft's weights over the target's, token embedding tables left out of both."""
    def weights(model: torch.nn.Module) -> int:
        embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        return sum(p.numel() for p in model.parameters() if id(p) not in embedding)

    target_weights = weights(target)
    return weights(draft) / target_weights if target_weights else 0.0


def k_table(model, prompts: list[list[int]], *, aux_layer_ids: list[int],
            new_proposer: Callable[[list[int]], Proposer], k_max: int, max_new_tokens: int, eos: set[int],
            draft_cost: float, device: torch.device | None = None,
            on_progress: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> KTable:
    """τ and acceptance by position for k = 1..k_max over `prompts` (one probing decode each), and the k to serve.
    `should_stop` is asked before each prompt, as measure asks it: the probes cost about what the measurement
    did, and a cancel must not wait for them."""
    probes = k_probes(model, prompts, aux_layer_ids=aux_layer_ids, new_proposer=new_proposer, k_max=k_max,
                      max_new_tokens=max_new_tokens, eos=eos, device=device, on_progress=on_progress,
                      should_stop=should_stop)
    return k_table_of(probes, k_max=k_max, draft_cost=draft_cost)


def k_probes(model, prompts: list[list[int]], *, aux_layer_ids: list[int],
             new_proposer: Callable[[list[int]], Proposer], k_max: int, max_new_tokens: int, eos: set[int],
             device: torch.device | None = None, on_progress: Callable[[int, int], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> list[tuple[int, list[int]]]:
    """Per prompt, in order: (output tokens after the cuts, probe_decode's lengths). A sharded evaluation
    keeps each shard's and builds one table from them all (k_table_of), as one worker would."""
    target = TargetRunner(model, aux_layer_ids, device=device)
    probes = []
    try:
        for n, prompt in enumerate(prompts):
            if should_stop is not None and should_stop():
                raise EvaluationStopped(f"evaluation stopped on request in the k table after {n} prompts")
            tokens, lengths = probe_decode(target, new_proposer(prompt), prompt, k_max=k_max,
                                           max_new_tokens=max_new_tokens, eos=eos)
            probes.append((len(tokens), lengths))
            if on_progress is not None:
                on_progress(n + 1, len(prompts))
    finally:
        target.close()
    return probes


def k_table_of(probes: list[tuple[int, list[int]]], *, k_max: int, draft_cost: float) -> KTable:
    """The table from every prompt's probe, pooled over all their verification forwards."""
    measured = {}
    for k in range(1, k_max + 1):
        accepted = [a for emitted, lengths in probes for a in walk(lengths, emitted, k)]
        measured[k] = tau_from_accepted(accepted, k)
    recommended, per_forward = recommend_k({k: tau for k, (tau, _) in measured.items()}, draft_cost)
    rows = [KRow(k=k, tau=tau, acceptance_per_position=per_position, tokens_per_target_forward=per_forward[k])
            for k, (tau, per_position) in measured.items()]
    return KTable(k_max=k_max, draft_cost=draft_cost, rows=rows, recommended_k=recommended)
