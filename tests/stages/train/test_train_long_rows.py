"""Rows of hundreds of tokens, replies at their end, as in users' data: the train stage trains on
every supervised token, splits by conversation and says what it did.

Inputs go through the real prepare stage (so rows carry `source_id`), then the target's hidden
states for each row (tests/helpers/long_chats.py)."""
import json
import logging

import pytest
import torch

from tests.helpers.long_chats import build_training_inputs, write_long_chats
from workers.stages.device import device_label, resolve_device
from workers.stages.train.data import HiddenStateSamples, iter_batches, plan_training_steps
from workers.stages.train.loop import train

MAX_SEQ_LEN = 640  # the demo target takes 2048 positions
DRAFT_VOCAB = 512


@pytest.fixture(scope="module")
def long_inputs(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("long-in")
    chats = write_long_chats(root / "chats.jsonl", num_conversations=5, seed=0)
    return build_training_inputs(tiny_target.target_dir, chats, root, max_seq_len=MAX_SEQ_LEN,
                                 draft_vocab_size=DRAFT_VOCAB)


def run_train(inputs, out_dir, **overrides):
    kwargs = dict(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                  hidden_states_dir=inputs.hidden_states_dir, d2t_path=inputs.d2t_path, t2d_path=inputs.t2d_path,
                  out_dir=out_dir, layer_ids=inputs.layer_ids, epochs=2, lr=3e-3, ttt_steps=2,
                  draft_vocab_size=inputs.draft_vocab_size, val_fraction=0.2, seed=0)
    kwargs.update(overrides)
    return train(**kwargs)


@pytest.fixture(scope="module")
def long_trained(long_inputs, tmp_path_factory):
    return run_train(long_inputs, tmp_path_factory.mktemp("long-out"))


def _train_split_loss_tokens(inputs, result) -> int:
    train_rows = json.loads((result.out_dir / "split.json").read_text())["train_rows"]
    return sum(sum(inputs.loss_masks[i]) for i in train_rows)


def test_the_chats_make_long_rows_with_replies_at_their_end(long_inputs):
    lengths = long_inputs.lengths
    assert max(lengths) > 512 and sum(n > 256 for n in lengths) >= len(lengths) // 2, lengths
    assert max(lengths) <= MAX_SEQ_LEN
    for mask in long_inputs.loss_masks:
        last = len(mask) - 1 - mask[::-1].index(1)
        assert mask[0] == 0 and last >= len(mask) - 2  # context first; the reply and its end token close the row
    assert len(set(long_inputs.source_ids)) == 5


def test_default_budget_covers_the_longest_row(long_trained, long_inputs):
    assert long_trained.tokens_per_step == max(512, max(long_inputs.lengths)) >= max(long_inputs.lengths)


def test_every_supervised_token_reaches_the_loss_in_every_epoch(long_trained, long_inputs):
    expected = _train_split_loss_tokens(long_inputs, long_trained)
    assert expected > 0
    assert long_trained.loss_tokens_available == expected
    assert long_trained.loss_tokens_per_epoch == [expected, expected]
    assert long_trained.loss_tokens_trained == expected and long_trained.rows_unusable == 0


def test_a_requested_budget_below_the_longest_row_is_raised_and_logged(long_inputs, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="workers.stages.train.data"):
        result = run_train(long_inputs, tmp_path / "out", epochs=1, max_tokens_per_step=256)
    longest = max(long_inputs.lengths)
    assert result.tokens_per_step == longest
    assert f"max_tokens_per_step 256 raised to {longest}" in caplog.text
    assert result.loss_tokens_trained == result.loss_tokens_available == _train_split_loss_tokens(long_inputs, result)


def test_split_keeps_each_conversation_on_one_side_and_is_written(long_trained, long_inputs):
    split = long_trained.split
    written = json.loads((long_trained.out_dir / "split.json").read_text())
    ids = long_inputs.source_ids
    train_ids = {ids[i] for i in written["train_rows"]}
    val_ids = {ids[i] for i in written["val_rows"]}
    assert not train_ids & val_ids and set(written["val_conversations"]) == val_ids
    assert sorted(written["train_rows"] + written["val_rows"]) == list(range(len(ids)))
    assert (split.by, split.seed, split.val_fraction) == ("conversation", 0, 0.2)
    assert (split.train_rows, split.val_rows) == (len(written["train_rows"]), len(written["val_rows"]))
    assert (split.train_conversations, split.val_conversations) == (len(train_ids), len(val_ids))
    assert written["train_conversations"] == len(train_ids) and written["sizes"] == split.as_dict()
    assert split.val_rows >= round(len(ids) * 0.2)


def test_the_device_it_ran_on_is_recorded(long_trained):
    assert long_trained.device == device_label(resolve_device("auto"))
    assert resolve_device("cpu") == torch.device("cpu") and device_label(torch.device("cpu")) == "cpu"
    if not torch.cuda.is_available():
        assert long_trained.device == "cpu"
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("meta")


def test_a_row_longer_than_the_budget_is_refused_not_cut(long_inputs):
    samples = HiddenStateSamples(prepared_dir=long_inputs.prepared_dir,
                                             hidden_states_dir=long_inputs.hidden_states_dir,
                                             layer_ids=long_inputs.layer_ids, hidden_size=128)
    longest = max(range(len(samples)), key=samples.lengths.__getitem__)
    with pytest.raises(ValueError, match="longer than max_tokens=256"):
        plan_training_steps(samples.lengths, [longest], max_tokens=256, seed=0, epoch=0)
    with pytest.raises(ValueError, match="over max_tokens=256"):
        next(iter_batches(samples, [[longest]], max_tokens=256))
    batch = next(iter_batches(samples, [[longest]], max_tokens=samples.lengths[longest]))
    assert int(batch["loss_mask"].sum()) == samples.trainable_loss_tokens[longest]
    assert batch["input_ids"].shape[1] == samples.lengths[longest] - 1


def test_speculators_collator_alone_would_cut_the_reply_of_a_long_row(long_inputs):
    """Why the guards above exist (speculators 0.9 train/data.py CollateFn.__call__): it keeps the
    first max_len tokens of a batch, so a long row's reply, at its end, never reaches the loss."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn

    samples = HiddenStateSamples(prepared_dir=long_inputs.prepared_dir,
                                             hidden_states_dir=long_inputs.hidden_states_dir,
                                             layer_ids=long_inputs.layer_ids, hidden_size=128)
    row = next(i for i, n in enumerate(samples.lengths) if n > 512 and sum(long_inputs.loss_masks[i][:256]) == 0)
    cut = CollateFn(256, 128, num_target_layers=len(long_inputs.layer_ids) - 1, dtype=torch.float32,
                    preprocess=shift_batch)([samples[row]])
    assert int(cut["loss_mask"].sum()) == 0 < samples.trainable_loss_tokens[row]

