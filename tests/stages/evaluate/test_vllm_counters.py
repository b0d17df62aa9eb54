"""Known answers for what the serve check reads from vLLM (workers/stages/evaluate/serve_check.py): its
/metrics page in vLLM 0.32's exposition, and τ on emitted tokens when some decode steps had no drafts
and replies end past what vLLM's counters count. No vLLM and no model here: the page is a literal,
rendered by vLLM 0.32's own SpecDecodingProm and prometheus_client, with the requests' steps below."""
from __future__ import annotations

import hashlib

import pytest

from workers.contract.acceptance import tau_from_accepted
from workers.stages.evaluate.serve_check import emitted_tau, parse_spec_counters, prompts_digest
from workers.stages.extract.vllm_server import VllmServerError

K = 3

# Three requests served one at a time, k = 3; each step is (had drafts, drafts accepted), and the
# prefill's token comes first. A: max_tokens 10, its last step's 4 tokens cut to 3. B: a step vLLM
# ran without drafts, then the end token second of its last step's 4 tokens. C: the end token first.
STEPS = {"A": [(True, 3), (True, 1), (True, 3)], "B": [(True, 2), (False, 0), (True, 3)], "C": []}
EMITTED = {"A": 10, "B": 7, "C": 1}  # tokens in each reply
DRAFTS, ACCEPTED, PER_POSITION, DECODE_STEPS = 5, 12, [5, 4, 3], 6

BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/data/target"} 2.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="/data/target"} 1.796419837246561e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/data/target"} 6.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/data/target"} 5.0
# HELP vllm:spec_decode_num_accepted_tokens_created Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_created gauge
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="/data/target"} 1.7964198372466009e+09
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/data/target",position="0"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/data/target",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/data/target",position="2"} 1.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="/data/target",position="0"} 1.79641983e+09
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="/data/target"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.1",model_name="/data/target"} 1.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="/data/target"} 2.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="/data/target"} 2.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="/data/target"} 0.25
# HELP vllm:inter_token_latency_seconds_created Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds_created gauge
vllm:inter_token_latency_seconds_created{engine="0",model_name="/data/target"} 1.796419837246707e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="/data/target"} 1.0
"""


def _after() -> str:
    """BEFORE with the three requests counted on top."""
    text = BEFORE
    for name, before, added in (("drafts", "2.0", DRAFTS), ("draft_tokens", "6.0", DRAFTS * K),
                                ("accepted_tokens", "5.0", ACCEPTED)):
        line = f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="/data/target"}} '
        text = text.replace(line + before, line + f"{float(before) + added}")
    for pos, (before, added) in enumerate(zip((2.0, 2.0, 1.0), PER_POSITION)):
        line = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="/data/target",position="{pos}"}} '
        text = text.replace(line + f"{before}", line + f"{before + added}")
    line = 'vllm:inter_token_latency_seconds_count{engine="0",model_name="/data/target"} '
    return text.replace(line + "2.0", line + f"{2.0 + DECODE_STEPS}")


def _outputs() -> list[list[int]]:
    return [list(range(EMITTED[name])) for name in STEPS]


def test_the_steps_above_give_the_counters_above():
    """What vLLM's scheduler counts (SpecDecodingStats.observe_draft: a draft per step with drafts, its
    accepted tokens whatever the reply keeps) and its output processor (an inter-token latency per
    step that emitted tokens after the first), from the steps."""
    drafted = [a for steps in STEPS.values() for had, a in steps if had]
    assert len(drafted) == DRAFTS and sum(drafted) == ACCEPTED
    assert [sum(a > i for a in drafted) for i in range(K)] == PER_POSITION
    assert sum(len(steps) for steps in STEPS.values()) == DECODE_STEPS
    # the tokens each reply's steps made, against what it kept: A made 11 (kept 10), B 9 (kept 7)
    made = {name: 1 + sum(1 + a if had else 1 for had, a in steps) for name, steps in STEPS.items()}
    assert made == {"A": 11, "B": 9, "C": 1}


def test_parsing_vllm_0_32s_metrics_page():
    before, after = parse_spec_counters(BEFORE, k=K), parse_spec_counters(_after(), k=K)
    assert (before.drafts, before.draft_tokens, before.accepted_tokens, before.accepted_per_position,
            before.decode_steps) == (2, 6, 5, [2, 2, 1], 2)
    assert (after.drafts - before.drafts, after.accepted_tokens - before.accepted_tokens) == (DRAFTS, ACCEPTED)
    assert [a - b for a, b in zip(after.accepted_per_position, before.accepted_per_position)] == PER_POSITION
    assert after.decode_steps - before.decode_steps == DECODE_STEPS


def test_engines_are_summed_and_positions_past_k_dropped():
    two = BEFORE + BEFORE.replace('engine="0"', 'engine="1"').replace('position="2"', 'position="3"')
    counters = parse_spec_counters(two, k=K)
    assert (counters.drafts, counters.accepted_tokens, counters.decode_steps) == (4, 10, 4)
    assert counters.accepted_per_position == [4, 4, 1]  # engine 1's position 3 is past k


def test_a_page_without_the_latency_histogram_has_no_step_count():
    page = "\n".join(line for line in BEFORE.splitlines() if "inter_token_latency" not in line)
    assert parse_spec_counters(page, k=K).decode_steps is None
    assert parse_spec_counters("", k=K).drafts == 0


def test_tau_on_emitted_tokens_counts_only_the_steps_that_had_drafts():
    before, after = parse_spec_counters(BEFORE, k=K), parse_spec_counters(_after(), k=K)
    drafts = after.drafts - before.drafts
    tau, undrafted = emitted_tau(outputs=_outputs(), drafts=drafts,
                                 decode_steps=after.decode_steps - before.decode_steps)
    # The drafted steps emitted A: 4, 2, 3 and B: 3, 2 tokens (B's undrafted step emitted 1, left out).
    assert undrafted == 1 and tau == pytest.approx(14 / 5)
    # Our definition on the same steps (workers/stages/evaluate/speculative.py): accepted = emitted - 1
    # per verification forward, τ = 1 + their mean.
    assert tau == pytest.approx(tau_from_accepted([3, 1, 2, 2, 1], K)[0])
    # vLLM's counters (1 + accepted / drafts) also count A's 1 and B's 2 tokens past the replies' ends.
    assert 1 + ACCEPTED / drafts == pytest.approx(3.4)
    # What the check reported before: the undrafted step's token over the drafts, 15 / 5.
    assert sum(len(o) - 1 for o in _outputs()) / drafts == pytest.approx(3.0) != pytest.approx(tau)


def test_without_a_step_count_every_step_is_taken_as_drafted():
    assert emitted_tau(outputs=_outputs(), drafts=DRAFTS, decode_steps=None) == (pytest.approx(3.0), 0)


@pytest.mark.parametrize("drafts, steps", [(5, 4), (0, 6), (5, 16)])
def test_counters_that_cannot_be_are_refused(drafts, steps):
    """Fewer steps than drafts, no drafts, or more steps than the replies' tokens could have come from."""
    with pytest.raises(VllmServerError, match="vLLM's counters do not add up"):
        emitted_tau(outputs=_outputs(), drafts=drafts, decode_steps=steps)


def test_the_prompt_lists_digest_names_its_token_ids_in_order():
    count, digest = prompts_digest([[1, 2], [3]])
    assert (count, digest) == (2, hashlib.sha256(b"[[1,2],[3]]").hexdigest())
    assert prompts_digest([[3], [1, 2]])[1] != digest and prompts_digest([[1, 2], [3], []])[0] == 3
