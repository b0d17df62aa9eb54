"""What a measurement records of each reply, token by token (workers.stages.evaluate.speculative.token_trace
and workers.stages.evaluate.generations), against answers known before decoding: the real tiny target
decodes with the stand-in proposers of tests/helpers/generations.py (an oracle: every draft accepted, τ = k + 1;
an always-wrong one: none, every token the target's; one right at position 1 only: τ = 2), EOS off so
that every reply is exactly MAX_NEW tokens."""
from __future__ import annotations

import hashlib

import pytest

from tests.helpers.generations import FULL_CHAINS, K, MAX_NEW, measured
from tests.stages.evaluate.test_evaluate import chat_prompts, inputs, untrained_checkpoint  # noqa: F401 - fixtures
from workers.stages.evaluate import generations
from workers.stages.evaluate.measure import evaluate
from workers.stages.evaluate.speculative import PromptResult, token_trace

PREFILL = [None]  # the prefill's token: the target's, verification forward 0


@pytest.fixture(scope="module")
def oracle(tiny_target):
    return measured(tiny_target, "oracle", eos=set())


@pytest.fixture(scope="module")
def wrong(tiny_target):
    return measured(tiny_target, "wrong", eos=set())


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from workers.stages.prepare.render import load_tokenizer

    return load_tokenizer(tiny_target.target_dir)


def test_token_trace_of_known_steps():
    # k = 3: two drafts accepted then a correction of the third (9), all three then the bonus, none accepted.
    steps = [([5, 6, 9], 2), ([7, 8, 1], 3), ([4, 4, 4], 0)]
    proposed_at, verify_step, rejected = token_trace(steps, 9)
    assert proposed_at == [None, 1, 2, None, 1, 2, 3, None, None]
    assert verify_step == [0, 1, 1, 1, 2, 2, 2, 2, 3]
    assert rejected == [None, None, None, 9, None, None, None, None, 4]
    # A reply cut by max_new_tokens or EOS keeps the trace of its tokens only.
    assert token_trace(steps, 5) == ([None, 1, 2, None, 1], [0, 1, 1, 1, 2], [None, None, None, 9, None])


def test_an_oracle_draft_has_every_drafted_token_accepted_and_tau_k_plus_1(oracle):
    table = oracle.table
    assert table["num_speculative_tokens"] == K and len(table["prompts"]) == len(oracle.prompts) == 3
    for prompt, row in zip(oracle.prompts, table["prompts"]):
        assert row["tau"] == K + 1 and row["verify_forwards"] == FULL_CHAINS and row["new_tokens"] == MAX_NEW
        assert row["proposed_at"] == PREFILL + [1, 2, 3, None] * FULL_CHAINS  # k drafts, then the bonus token
        assert row["verify_step"] == [0] + [s for s in range(1, FULL_CHAINS + 1) for _ in range(K + 1)]
        assert row["rejected_ids"] == [None] * MAX_NEW and row["rejected_texts"] == [None] * MAX_NEW
        assert row["prompt_tokens"] == len(prompt) and row["matches_greedy"] and not row["tokens_cut"]


def test_an_always_wrong_draft_has_no_token_proposed_and_every_draft_rejected(oracle, wrong, tokenizer):
    for right, row in zip(oracle.table["prompts"], wrong.table["prompts"]):
        assert row["tau"] == 1.0 and row["verify_forwards"] == MAX_NEW - 1
        assert row["proposed_at"] == [None] * MAX_NEW
        assert row["verify_step"] == list(range(MAX_NEW))  # one token per forward
        assert row["ids"] == right["ids"]  # the same greedy text whatever the draft
        # The stand-in proposed the target's token + 1 at position 1 of each forward, which the target replaced.
        assert row["rejected_ids"] == [None] + [t + 1 for t in right["ids"][1:]]
        assert row["rejected_texts"][1:] == [tokenizer.decode([t + 1]) for t in right["ids"][1:]]


def test_the_token_texts_spell_the_reply_and_the_prompt_is_matched_by_its_ids(oracle, wrong, tokenizer):
    for prompt, row, other in zip(oracle.prompts, oracle.table["prompts"], wrong.table["prompts"]):
        assert "".join(row["texts"]) == tokenizer.decode(row["ids"])
        assert row["prompt_sha256"] == hashlib.sha256(",".join(map(str, prompt)).encode()).hexdigest()
        assert other["prompt_sha256"] == row["prompt_sha256"]
        assert row["prompt_tail"] == tokenizer.decode(prompt[-generations.PROMPT_TAIL_TOKENS:])
    assert len({row["prompt_sha256"] for row in oracle.table["prompts"]}) == 3


def test_a_long_reply_is_cut_at_the_cap_and_its_tau_counts_the_whole_reply(tokenizer):
    # 74 forwards of three accepted drafts and a bonus token, after the prefill's token: 297 tokens.
    steps = [([1, 2, 3], 3)] * 74
    proposed_at, verify_step, rejected = token_trace(steps, 1 + len(steps) * (K + 1))
    tokens = [100 + i % 50 for i in range(len(proposed_at))]
    result = PromptResult(prompt_tokens=7, new_tokens=len(tokens), verify_forwards=len(steps),
                          accepted=[K] * len(steps), matches_greedy=True, tokens=tokens, proposed_at=proposed_at,
                          verify_step=verify_step, rejected=rejected)
    row = generations.generation_table([[1] * 7], [result], k=K, tokenizer=tokenizer)["prompts"][0]
    assert len(row["ids"]) == len(row["texts"]) == len(row["proposed_at"]) == generations.MAX_TOKENS
    assert row["tokens_cut"] and row["new_tokens"] == len(tokens) == 297 and row["tau"] == K + 1
    many = generations.generation_table([[1]] * 70, [result] * 70, k=K, tokenizer=tokenizer)
    assert len(many["prompts"]) == many["prompts_cap"] == generations.MAX_PROMPTS == 64


def test_the_evaluate_stage_records_the_replies_of_a_real_draft(tiny_target, untrained_checkpoint, chat_prompts):
    """evaluate() with an untrained EAGLE-3 draft: its generations agree with its own counts prompt by
    prompt (the accepted drafts it emitted, its verification forwards), and their τ make up the whole τ."""
    result = evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=untrained_checkpoint, prompts=chat_prompts,
                      prompt_source="chat prompts", max_new_tokens=24)
    rows = result.generations["prompts"]
    assert len(rows) == len(chat_prompts) == result.num_prompts and result.generations["num_speculative_tokens"] == K
    for row, prompt in zip(rows, result.prompts):
        assert row["ids"] == prompt.tokens and len(row["texts"]) == prompt.new_tokens
        assert sum(at is not None for at in row["proposed_at"]) == sum(prompt.accepted)
        assert len(set(row["verify_step"])) == prompt.verify_forwards + 1
        assert all(at is None or 1 <= at <= K for at in row["proposed_at"])
    emitted = sum(row["tau"] * row["verify_forwards"] for row in rows)
    assert emitted / sum(row["verify_forwards"] for row in rows) == pytest.approx(result.tau)
