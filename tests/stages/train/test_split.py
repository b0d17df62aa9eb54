"""The train/validation split: whole conversations on one side, deterministic for a seed."""
import pytest

from workers.contract.chats.prompt_source import EvaluationInputError, validation_rows
from workers.stages.train.with_speculators.plan import speculators_split
from workers.stages.train.holdout.split import SplitError, split_record, split_train_val, write_split

# 12 conversations of 1-5 rows each, rows of a conversation adjacent as prepare writes them.
IDS = [f"c{c}" for c in range(12) for _ in range(1 + c % 5)]


def _sides(source_ids, train_rows, val_rows):
    return {source_ids[i] for i in train_rows}, {source_ids[i] for i in val_rows}


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize("val_fraction", [0.05, 0.1, 0.3, 0.9])
def test_no_conversation_is_on_both_sides_and_sizes_match(seed, val_fraction):
    train_rows, val_rows, info = split_train_val(IDS, val_fraction=val_fraction, seed=seed)
    train_ids, val_ids = _sides(IDS, train_rows, val_rows)
    assert not train_ids & val_ids and train_ids and val_ids
    assert sorted(train_rows + val_rows) == list(range(len(IDS)))
    assert train_rows == sorted(train_rows) and val_rows == sorted(val_rows)
    assert info.by == "conversation" and (info.seed, info.val_fraction) == (seed, val_fraction)
    assert (info.train_rows, info.val_rows) == (len(train_rows), len(val_rows))
    assert (info.train_conversations, info.val_conversations) == (len(train_ids), len(val_ids))
    # Validation reaches the asked-for share unless that would leave training no conversation.
    assert len(val_rows) >= round(len(IDS) * val_fraction) or info.train_conversations == 1


def test_deterministic_for_a_seed_and_different_for_another():
    first = split_train_val(IDS, val_fraction=0.2, seed=3)
    assert split_train_val(list(IDS), val_fraction=0.2, seed=3) == first
    others = {tuple(split_train_val(IDS, val_fraction=0.2, seed=s)[1]) for s in range(4, 10)}
    assert any(val != tuple(first[1]) for val in others)


def test_conversations_are_taken_whole_until_the_share_is_reached():
    # Shuffled order for seed 0 is fixed by numpy's default_rng; the share is reached by adding
    # whole conversations, so validation may exceed round(n * fraction) by less than one conversation.
    train_rows, val_rows, info = split_train_val(IDS, val_fraction=0.25, seed=0)
    want = round(len(IDS) * 0.25)
    biggest = max(IDS.count(c) for c in set(IDS))
    assert want <= len(val_rows) < want + biggest


def test_one_conversation_cannot_be_split_and_the_error_says_why():
    with pytest.raises(SplitError, match=r"only one conversation \(source_id 'c0'"):
        split_train_val(["c0", "c0", "c0"], val_fraction=0.5, seed=0)
    with pytest.raises(SplitError, match="val_fraction"):
        split_train_val(IDS, val_fraction=1.0, seed=0)


def test_without_source_ids_every_row_is_its_own_group():
    train_rows, val_rows, info = split_train_val(None, val_fraction=0.2, seed=0, num_rows=10)
    assert info.by == "row" and (info.train_rows, info.val_rows) == (8, 2)
    assert (info.train_conversations, info.val_conversations) == (8, 2)
    with pytest.raises(SplitError, match="1 prepared row"):
        split_train_val(None, val_fraction=0.2, seed=0, num_rows=1)


def test_record_names_the_held_out_conversations():
    train_rows, val_rows, info = split_train_val(IDS, val_fraction=0.2, seed=5)
    record = split_record(train_rows, val_rows, info, IDS)
    assert set(record["val_conversations"]) == {IDS[i] for i in val_rows}
    assert len(record["val_conversations"]) == info.val_conversations
    assert record["train_conversations"] == info.train_conversations
    assert (record["by"], record["seed"], record["val_fraction"]) == ("conversation", 5, 0.2)
    assert record["sizes"] == info.as_dict()


# speculators' trainer splits by position (rows [0, int(n * ratio)) train); it gets our split's rows
# in split order, train rows first, with a ratio whose boundary is exactly between the two sides.
CONTIGUOUS = ["a", "a", "b", "b", "b", "c", "c", "d"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("val_fraction", [0.2, 0.375, 0.5])
def test_speculators_split_is_ours_laid_out_train_first_with_no_conversation_on_both_sides(tmp_path, seed,
                                                                                            val_fraction):
    split = speculators_split(CONTIGUOUS, num_rows=8, val_fraction=val_fraction, seed=seed, prompt_keys=None)
    train_rows, val_rows, info = split_train_val(CONTIGUOUS, val_fraction=val_fraction, seed=seed)
    assert split.info == info and split.order == train_rows + val_rows and split.train_rows == len(train_rows)
    assert int(len(split.order) * split.train_data_ratio) == split.train_rows  # ArrowDataset's own expression
    trained = {CONTIGUOUS[i] for i in split.order[:split.train_rows]}
    validated = {CONTIGUOUS[i] for i in split.order[split.train_rows:]}
    assert trained and validated and not trained & validated
    assert split.record["val_rows"] == val_rows and split.record["train_rows"] == train_rows
    assert "straddling_conversations" not in split.record
    write_split(tmp_path, split.record)
    assert validation_rows(tmp_path) == val_rows


def test_an_evaluation_is_refused_when_a_recorded_split_holds_no_validation_row(tmp_path):
    # Runs trained before the split was ours recorded an empty side when speculators' positional split put
    # every validation row in a conversation it also trained on.
    write_split(tmp_path, {"by": "contiguous rows", "train_rows": [0, 1, 2], "val_rows": []})
    with pytest.raises(EvaluationInputError, match="no held-out conversation .* give a prompts file"):
        validation_rows(tmp_path)
