"""tau against answers known before decoding. The target is real (two tiny Llamas of the demo's shape)
and so are speculative_decode and the tau arithmetic of `measure`, which the evaluate stage runs; the
draft is a STAND-IN proposer whose acceptance is known in advance:
- an oracle that proposes the target's own greedy continuation: every draft is accepted;
- an always-wrong one that proposes a token other than the target's choice: none is.

Targets: `tiny_target` (trained; its greedy text repeats one token) and the same config with seeded
random weights, whose greedy text moves between tokens, so that an oracle off by one position, or an
EOS cut in the wrong place, would be caught."""
from __future__ import annotations

import math

import pytest
import torch

from workers.stages.evaluate.prompts import prompts_from_file
from workers.stages.extract.model import load_target
from workers.stages.evaluate.speculative import (
    TargetRunner,
    eos_ids,
    greedy_decode,
    measure,
    speculative_decode,
)
from workers.contract.target import default_layer_ids

K = 3
FULL_CHAINS = 5
MAX_NEW = 1 + (K + 1) * FULL_CHAINS  # the prefill's token, then five forwards of k + 1 tokens


@pytest.fixture(scope="module")
def random_target(tiny_target):
    from transformers import LlamaForCausalLM

    config = load_target(tiny_target.target_dir, torch.device("cpu")).config
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", params=["trained", "random-weights"])
def target(request, tiny_target):
    if request.param == "random-weights":
        return request.getfixturevalue("random_target")
    return load_target(tiny_target.target_dir, torch.device("cpu"))


@pytest.fixture(scope="module")
def prompts(tiny_target):
    return prompts_from_file(tiny_target.chats_path, tiny_target.target_dir, limit=3)


def continuation(model, prompt: list[int], n: int) -> list[int]:
    """The target's greedy next n tokens, EOS not stopping it: what the stand-ins propose from."""
    return greedy_decode(model, prompt, max_new_tokens=n, eos=set())


class OracleProposer:
    """STAND-IN draft: proposes the target's own greedy continuation."""

    def __init__(self, reference: list[int], vocab_size: int):
        self.reference, self.vocab_size = reference, vocab_size
        self.emitted = 0  # output tokens confirmed so far

    def extend(self, aux: torch.Tensor, next_tokens: list[int]) -> None:
        # The first call covers the prompt and the prefill's token; each later one a forward's tokens.
        self.emitted = 1 if self.emitted == 0 else self.emitted + len(next_tokens)

    def propose(self, k: int) -> list[int]:
        chain = self.reference[self.emitted:self.emitted + k]
        assert len(chain) == k, "the reference is too short for this budget"
        return chain


class AlwaysWrongProposer(OracleProposer):
    """STAND-IN draft: at every position a token other than the target's greedy choice."""

    def propose(self, k: int) -> list[int]:
        return [(t + 1) % self.vocab_size for t in super().propose(k)]


def _measure(model, prompts, proposer_class, *, max_new_tokens: int, eos: set[int]):
    references = {tuple(p): continuation(model, p, max_new_tokens + K) for p in prompts}
    return measure(model, prompts, aux_layer_ids=default_layer_ids(model.config.num_hidden_layers),
                   new_proposer=lambda p: proposer_class(references[tuple(p)], model.config.vocab_size), k=K,
                   max_new_tokens=max_new_tokens, eos=eos)


def _no_eos_within(model, prompts, n: int) -> set[int]:
    eos = eos_ids(model)
    for p in prompts:
        assert not eos.intersection(continuation(model, p, n)), "EOS would cut this prompt: choose another"
    return eos


def test_oracle_proposer_stand_in_gives_tau_k_plus_1_and_the_greedy_text(target, prompts):
    eos = _no_eos_within(target, prompts, MAX_NEW)
    measured = _measure(target, prompts, OracleProposer, max_new_tokens=MAX_NEW, eos=eos)
    assert measured.tau == K + 1
    assert measured.acceptance_per_position == [1.0] * K
    assert measured.verify_forwards == FULL_CHAINS * len(prompts)
    assert measured.mismatched_prompts == [] and measured.new_tokens == MAX_NEW * len(prompts)


def test_always_wrong_proposer_stand_in_gives_tau_1_and_the_greedy_text(target, prompts):
    eos = _no_eos_within(target, prompts, MAX_NEW)
    measured = _measure(target, prompts, AlwaysWrongProposer, max_new_tokens=MAX_NEW, eos=eos)
    assert measured.tau == 1.0
    assert measured.acceptance_per_position == [0.0] * K
    assert measured.verify_forwards == (MAX_NEW - 1) * len(prompts)  # one token per forward
    assert measured.mismatched_prompts == [] and measured.new_tokens == MAX_NEW * len(prompts)


def test_oracle_proposer_stand_in_counts_only_the_tokens_a_cut_last_forward_emits(target, prompts):
    # Two tokens past the full chains: the last forward verifies k drafts, but the output keeps two
    # of its k + 1 tokens, so it counts one accepted draft, not k.
    max_new = MAX_NEW + 2
    eos = _no_eos_within(target, prompts, max_new + K)
    measured = _measure(target, prompts, OracleProposer, max_new_tokens=max_new, eos=eos)
    forwards = FULL_CHAINS + 1
    assert measured.verify_forwards == forwards * len(prompts)
    assert measured.tau == pytest.approx((max_new - 1) / forwards) and measured.tau < K + 1
    assert measured.acceptance_per_position == pytest.approx([1.0, FULL_CHAINS / forwards, FULL_CHAINS / forwards])
    assert [r.accepted for r in measured.prompts] == [[K] * FULL_CHAINS + [1]] * len(prompts)
    assert measured.mismatched_prompts == []


def test_oracle_proposer_stand_in_counts_nothing_after_eos(random_target, prompts):
    """EOS is set to a token the greedy text first reaches mid-chain, so the output ends there."""
    model = random_target
    # A prompt and an index whose token appears there first, and not as the last token of a forward.
    prompt, reference, cut = next((p, r, j) for p in prompts for r in [continuation(model, p, MAX_NEW + K)]
                                  for j in range(2, MAX_NEW) if r[j] not in r[:j] and j % (K + 1))
    eos = {reference[cut]}
    runner = TargetRunner(model, default_layer_ids(model.config.num_hidden_layers))
    try:
        tokens, accepted = speculative_decode(runner, OracleProposer(reference, model.config.vocab_size), prompt,
                                              k=K, max_new_tokens=MAX_NEW, eos=eos)
    finally:
        runner.close()
    assert tokens == reference[:cut + 1] == greedy_decode(model, prompt, max_new_tokens=MAX_NEW, eos=eos)
    forwards = math.ceil(cut / (K + 1))
    assert len(accepted) == forwards and sum(a + 1 for a in accepted) == cut  # the tokens after the prefill's
    assert accepted[:-1] == [K] * (forwards - 1) and accepted[-1] == cut - (K + 1) * (forwards - 1) - 1
