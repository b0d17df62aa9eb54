"""An evaluation split into shards (issue 36): τ, acceptance by position, the counts, the per-prompt
results and the generations merged from the parts equal one worker's evaluate() over the same prompts,
with a trained draft (acceptance well above zero) on
prompts shaped like users': held-out conversations, long multi-turn chats in both formats with odd
unicode, and the same prompt twice."""
from __future__ import annotations

import pytest

from tests.helpers.long_chats import write_long_chats
from tests.stages.evaluate.test_evaluate import inputs, prompts, trained_checkpoint  # noqa: F401 - fixtures
from workers.contract.chats.prompt_source import EvaluationInputError
from workers.stages.evaluate.prompts import prompts_from_file
from workers.stages.evaluate.measure import evaluate
from workers.stages.evaluate.merge import evaluate_merge
from workers.stages.shards import shard_dir, spans_split

MAX_NEW = 24
SAME = ("tau", "acceptance_per_position", "new_tokens", "verify_forwards", "num_prompts", "mismatched_prompts",
        "output_matches_greedy", "prompts", "generations", "tau_standard_error", "num_speculative_tokens",
        "k_table", "recommended_k")


@pytest.fixture(scope="module")
def user_prompts(tiny_target, prompts, tmp_path_factory):  # noqa: F811
    chats = write_long_chats(tmp_path_factory.mktemp("eval-shards") / "long.jsonl", num_conversations=4, seed=2,
                             turns=(2, 3), user_words=(3, 6))
    long = prompts_from_file(chats, tiny_target.target_dir, limit=4)
    return prompts[:4] + long[:2] + [prompts[1]] + long[2:] + prompts[4:]


@pytest.fixture(scope="module")
def one_worker(tiny_target, trained_checkpoint, user_prompts):  # noqa: F811
    return evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=user_prompts,
                    prompt_source="users' prompts", max_new_tokens=MAX_NEW)


def test_three_shards_give_one_workers_tau_and_acceptance(tiny_target, trained_checkpoint, user_prompts,  # noqa: F811
                                                          one_worker, tmp_path):
    spans = spans_split(len(user_prompts), 3)
    for index in (2, 0, 1):  # in any order, as workers take them
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=user_prompts,
                 prompt_source="users' prompts", max_new_tokens=MAX_NEW, rows=spans[index],
                 part_dir=shard_dir(tmp_path, index))
    merged = evaluate_merge(part_dirs=[shard_dir(tmp_path, i) for i in range(3)], target_dir=tiny_target.target_dir,
                            checkpoint_dir=trained_checkpoint, prompts=user_prompts, prompt_source="users' prompts",
                            max_new_tokens=MAX_NEW)
    for name in SAME:
        assert getattr(merged, name) == getattr(one_worker, name), name
    # A draft that proposes well: acceptance and the k table carry information to get wrong.
    assert 0.3 < one_worker.acceptance_per_position[0] and one_worker.tau > 1.3 and one_worker.k_table["rows"]
    assert len(user_prompts) == 11 and one_worker.prompts[1] == one_worker.prompts[6]  # the repeated prompt


def test_a_missing_part_or_a_bad_span_is_refused(tiny_target, trained_checkpoint, user_prompts, tmp_path):  # noqa: F811
    with pytest.raises(EvaluationInputError, match=r"rows 10\.\.12 is not a span of the 11 prompts"):
        evaluate(target_dir=tiny_target.target_dir, checkpoint_dir=trained_checkpoint, prompts=user_prompts,
                 prompt_source="x", max_new_tokens=MAX_NEW, rows=range(10, 12), part_dir=tmp_path)
    with pytest.raises(EvaluationInputError, match=r"00001: a shard's part is missing"):
        evaluate_merge(part_dirs=[shard_dir(tmp_path, 1)], target_dir=tiny_target.target_dir,
                       checkpoint_dir=trained_checkpoint, prompts=user_prompts, prompt_source="x",
                       max_new_tokens=MAX_NEW)
