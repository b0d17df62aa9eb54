"""The k table (workers/stages/evaluate/k_table.py) against answers known before decoding: the real tiny
target and the real probing decode and walk, with STAND-IN drafts whose acceptance is known at every k (the
oracle proposes the target's greedy continuation, the always-wrong one a token other than it). The walk
against separate speculative decodes with a real draft is in test_evaluate.py."""
from __future__ import annotations

import pytest
import torch

from tests.stages.evaluate.test_tau_known_answers import AlwaysWrongProposer, OracleProposer, continuation
from workers.contract.target import default_layer_ids
from workers.stages.evaluate.k_table import k_limit, k_table, recommend_k, walk
from workers.stages.evaluate.prompts import prompts_from_file
from workers.stages.evaluate.speculative import eos_ids
from workers.stages.extract.model import load_target

K_MAX = 5
# 60 tokens after the prefill's divide into whole chains of k + 1 for every k up to 5 (lcm of 2..6 is 60),
# so the oracle's τ is exactly k + 1 with no cut forward.
MAX_NEW = 61


@pytest.fixture(scope="module")
def target(tiny_target):
    torch.set_num_threads(1)
    return load_target(tiny_target.target_dir, torch.device("cpu"))


@pytest.fixture(scope="module")
def prompts(tiny_target):
    return prompts_from_file(tiny_target.chats_path, tiny_target.target_dir, limit=2)


def _table(model, prompts, proposer_class, *, draft_cost: float = 0.0):
    references = {tuple(p): continuation(model, p, MAX_NEW + K_MAX) for p in prompts}
    eos = eos_ids(model)
    assert not any(eos.intersection(r[:MAX_NEW]) for r in references.values()), "EOS would cut a prompt"
    return k_table(model, prompts, aux_layer_ids=default_layer_ids(model.config.num_hidden_layers),
                   new_proposer=lambda p: proposer_class(references[tuple(p)], model.config.vocab_size),
                   k_max=K_MAX, max_new_tokens=MAX_NEW, eos=eos, draft_cost=draft_cost)


def test_oracle_stand_in_accepts_every_position_at_every_k(target, prompts):
    table = _table(target, prompts, OracleProposer)
    assert [r.k for r in table.rows] == [1, 2, 3, 4, 5]
    for row in table.rows:
        assert row.tau == row.k + 1
        assert row.acceptance_per_position == [1.0] * row.k
    # Nothing costs the draft: the longest chain emits the most per target forward.
    assert table.recommended_k == K_MAX


def test_always_wrong_stand_in_accepts_no_position_at_any_k(target, prompts):
    table = _table(target, prompts, AlwaysWrongProposer, draft_cost=0.1)
    for row in table.rows:
        assert row.tau == 1.0
        assert row.acceptance_per_position == [0.0] * row.k
    # Every k emits one token per forward: the cheapest draft, k = 1, is recommended.
    assert table.recommended_k == 1


def test_oracle_with_a_costly_draft_recommends_the_k_where_cost_overtakes_acceptance(target, prompts):
    # τ_k = k + 1, cost 1 + 0.5 k: tokens per forward (k + 1) / (1 + 0.5 k) = 1.33, 1.5, 1.6, 1.67, 1.71:
    # still rising at 5. With cost 1.0 per draft forward every k gives (k + 1) / (1 + k) = 1: k = 1.
    assert _table(target, prompts, OracleProposer, draft_cost=0.5).recommended_k == 5
    assert _table(target, prompts, OracleProposer, draft_cost=1.0).recommended_k == 1


def test_recommend_k_weighs_tau_against_the_draft_forwards():
    # 2.0 / 1.1 = 1.82, 3.0 / 1.2 = 2.50, 3.2 / 1.3 = 2.46
    best, per_forward = recommend_k({1: 2.0, 2: 3.0, 3: 3.2}, 0.1)
    assert best == 2 and per_forward[2] == pytest.approx(2.5)


def test_walk_counts_a_cut_last_forward_as_speculative_decoding_does():
    # Every position accepts 3 drafts; 6 tokens after the prefill with k = 3: one forward of 4, then one
    # whose 4 tokens are cut to 2 (one accepted draft counted, not 3).
    assert walk([3] * 9, 7, 3) == [3, 1]
    assert walk([0, 2, 0, 0, 0, 0], 7, 2) == [0, 2, 0, 0]


def test_k_limit_is_trained_steps_plus_beyond_at_most_16():
    assert k_limit(3, 2) == 5 and k_limit(15, 2) == 16 and k_limit(3, 0) == 3
