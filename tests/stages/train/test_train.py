"""The training stage on real hidden states from the tiny demo target, built here without the
prepare / extract / vocab stages: chats -> chat template with assistant masks -> one target forward
-> speculators 0.9 files (prepared dataset, hs_{i}.safetensors, d2t/t2d .npy)."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workers.stages.train import loop as train_stage
from workers.stages.demo.chats import read_chat_messages
from workers.contract.target import default_layer_ids, read_target_config
from workers.stages.device import device_label, resolve_device
from workers.stages.train.results import TrainingStopped
from workers.stages.train.data import TrainInputError
from workers.stages.train.draft.model import build_draft_model
from workers.stages.train.loop import train

NUM_ROWS = 32
DRAFT_VOCAB = 512


def write_training_inputs(target_dir: Path, chats_path: Path, out: Path, *, num_rows: int,
                          draft_vocab_size: int) -> SimpleNamespace:
    """Real hidden states of the target for its own chats, in speculators 0.9 layout."""
    from datasets import Dataset
    from safetensors.torch import save_file
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = LlamaForCausalLM.from_pretrained(target_dir).eval()
    layer_ids = default_layer_ids(model.config.num_hidden_layers)
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    freq: dict[int, int] = {}
    for i, messages in enumerate(read_chat_messages(chats_path)[:num_rows]):
        enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        with torch.no_grad():
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        hs = torch.stack([states[j][0] for j in layer_ids], dim=1).to(torch.bfloat16)
        save_file({"token_ids": torch.tensor(ids), "hidden_states": hs}, str(hs_dir / f"hs_{i}.safetensors"))
        rows["input_ids"].append(ids)
        rows["loss_mask"].append(mask)
        rows["seq_len"].append(len(ids))
        for tok, m in zip(ids, mask):
            freq[tok] = freq.get(tok, 0) + m
    Dataset.from_dict(rows).save_to_disk(str(out / "prepared"))
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, model.config.vocab_size)
    np.save(out / f"d2t-{draft_vocab_size}.npy", d2t.numpy())
    np.save(out / f"t2d-{draft_vocab_size}.npy", t2d.numpy())
    return SimpleNamespace(target_dir=Path(target_dir), prepared_dir=out / "prepared", hidden_states_dir=hs_dir,
                           d2t_path=out / f"d2t-{draft_vocab_size}.npy", t2d_path=out / f"t2d-{draft_vocab_size}.npy",
                           layer_ids=layer_ids, draft_vocab_size=draft_vocab_size)


@pytest.fixture(scope="module")
def inputs(tiny_target, tmp_path_factory):
    return write_training_inputs(tiny_target.target_dir, tiny_target.chats_path, tmp_path_factory.mktemp("train-in"),
                                 num_rows=NUM_ROWS, draft_vocab_size=DRAFT_VOCAB)


def run_train(inputs, out_dir: Path, **overrides):
    kwargs = dict(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                  hidden_states_dir=inputs.hidden_states_dir, d2t_path=inputs.d2t_path, t2d_path=inputs.t2d_path,
                  out_dir=out_dir, layer_ids=inputs.layer_ids, epochs=2, lr=3e-3, ttt_steps=3,
                  draft_vocab_size=inputs.draft_vocab_size, val_fraction=0.1, max_tokens_per_step=256, seed=0)
    kwargs.update(overrides)
    return train(**kwargs)


@pytest.fixture(scope="module")
def trained(inputs, tmp_path_factory):
    metrics: list[dict] = []
    calls: list[list[dict]] = []
    progress: list[tuple[int, int]] = []
    announced: list = []
    with pytest.MonkeyPatch.context() as mp:  # flush by step count only, so batching is deterministic
        mp.setattr(train_stage, "METRICS_FLUSH_SECONDS", 1e9)
        mp.setattr(train_stage, "METRICS_FLUSH_STEPS", 4)
        result = run_train(inputs, tmp_path_factory.mktemp("train-out"),
                           on_metrics=lambda batch: (calls.append(batch), metrics.extend(batch)),
                           on_progress=lambda done, total: progress.append((done, total)),
                           on_checkpoint=lambda c: announced.append((c, (c.path / "model.safetensors").exists())))
    return SimpleNamespace(result=result, metrics=metrics, calls=calls, progress=progress, announced=announced)


def test_train_loss_goes_down_over_epochs(trained):
    losses = [c.train_loss for c in trained.result.checkpoints]
    assert len(losses) == 2
    assert losses[-1] < losses[0] * 0.9, losses
    assert trained.result.checkpoints[-1].val_loss < trained.result.checkpoints[0].val_loss


def test_each_epoch_checkpoint_loads_and_names_verifier_and_aux_layers(trained, inputs):
    from speculators.models.eagle3 import Eagle3DraftModel

    assert [c.epoch for c in trained.result.checkpoints] == [0, 1]
    for ckpt in trained.result.checkpoints:
        assert ckpt.path == trained.result.out_dir / str(ckpt.epoch)
        for name in ("config.json", "model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt",
                     "training_state.json", "val_metrics.json"):
            assert (ckpt.path / name).is_file(), name
        config = json.loads((ckpt.path / "config.json").read_text())
        assert config["speculators_config"]["verifier"]["name_or_path"] == str(inputs.target_dir)
        assert config["eagle_aux_hidden_state_layer_ids"] == inputs.layer_ids[:-1]
        assert json.loads((ckpt.path / "val_metrics.json").read_text())["loss_epoch"] == pytest.approx(ckpt.val_loss)
    model = Eagle3DraftModel.from_pretrained(str(trained.result.checkpoints[-1].path))
    assert model.config.draft_vocab_size == DRAFT_VOCAB
    assert torch.equal(model.d2t, torch.from_numpy(np.load(inputs.d2t_path)))
    assert not any(torch.isnan(p).any() for p in model.parameters())


def test_metrics_cover_every_ttt_step_for_train_and_val(trained):
    keys = {(m["split"], m["key"]) for m in trained.metrics}
    per_step = {f"{name}_{k}" for k in range(3) for name in ("loss", "full_acc", "cond_acc")}
    for split in ("train", "val"):
        assert {(split, key) for key in per_step | {"loss"}} <= keys
    assert {("train", "lr"), ("train", "tokens_per_s")} <= keys
    assert not {("val", "lr"), ("val", "tokens_per_s")} & keys
    seen = [m["value"] for m in trained.metrics if m["key"] == "tokens_seen"]  # the x axis "tokens seen"
    assert seen == sorted(seen) and seen[-1] == trained.result.train_tokens
    val_epochs = sorted({m["epoch"] for m in trained.metrics if m["split"] == "val"})
    assert val_epochs == [1.0, 2.0]
    accs = [m["value"] for m in trained.metrics if "acc" in m["key"]]
    assert all(0.0 <= a <= 1.0 for a in accs)


def test_metrics_arrive_in_batches_and_each_epoch_ends_with_a_flush(trained):
    assert len(trained.calls) < trained.result.steps
    for batch in trained.calls:
        assert len({m["step"] for m in batch if m["split"] == "train"}) <= 4
    assert [m["split"] for m in trained.calls[-1]][-1] == "val"


def test_best_epoch_has_the_lowest_val_loss_and_is_linked(trained):
    result = trained.result
    best = min(result.checkpoints, key=lambda c: c.val_loss)
    assert result.best_epoch == best.epoch
    assert [c.is_best for c in result.checkpoints].count(True) == 1 and best.is_best
    assert (result.out_dir / "checkpoint_best").resolve() == best.path.resolve()


def test_each_checkpoint_is_announced_when_its_epoch_is_on_disk(trained):
    assert [c.epoch for c, _ in trained.announced] == [0, 1]
    assert all(on_disk for _, on_disk in trained.announced)
    assert [c.val_loss for c, _ in trained.announced] == [c.val_loss for c in trained.result.checkpoints]


def test_progress_and_counts_reach_the_total(trained):
    result = trained.result
    assert trained.progress[0] == (0, result.steps) and trained.progress[-1] == (result.steps, result.steps)
    assert result.train_tokens > 0 and result.tokens_per_second > 0 and result.seconds > 0


def test_should_stop_raises_training_stopped_and_saves_nothing(inputs, tmp_path):
    asked = []
    metrics: list[dict] = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(TrainingStopped) as info:
        run_train(inputs, tmp_path / "out", epochs=1, should_stop=should_stop, on_metrics=metrics.extend)
    assert info.value.steps_done == 2
    assert not (tmp_path / "out" / "0").exists()
    assert {m["step"] for m in metrics} == {1, 2}  # steps done before the stop were reported


def test_dataset_without_source_id_is_split_by_row_and_the_split_is_written(trained, inputs):
    from datasets import load_from_disk

    result = trained.result
    assert "source_id" not in load_from_disk(str(inputs.prepared_dir)).column_names
    assert result.split.by == "row"
    assert (result.split.train_rows, result.split.val_rows) == (NUM_ROWS - 3, 3)  # round(32 * 0.1)
    assert result.split.train_conversations == result.split.train_rows
    written = json.loads((result.out_dir / "split.json").read_text())
    assert written["by"] == "row" and sorted(written["train_rows"] + written["val_rows"]) == list(range(NUM_ROWS))
    assert written["val_conversations"] == [str(i) for i in written["val_rows"]]


def test_every_supervised_token_of_short_rows_is_trained_on(trained, inputs):
    from datasets import load_from_disk

    result = trained.result
    masks = load_from_disk(str(inputs.prepared_dir)).with_format(None)["loss_mask"]
    train_rows = json.loads((result.out_dir / "split.json").read_text())["train_rows"]
    assert result.loss_tokens_available == sum(sum(masks[i][1:]) for i in train_rows) > 0
    assert result.loss_tokens_per_epoch == [result.loss_tokens_available] * 2
    assert result.loss_tokens_trained == result.loss_tokens_available and result.rows_unusable == 0
    assert result.tokens_per_step == 256  # requested; the longest row is shorter
    assert result.device == device_label(resolve_device("auto"))


def test_a_single_prepared_row_cannot_be_split(inputs, tmp_path):
    from datasets import load_from_disk

    one = tmp_path / "one"
    load_from_disk(str(inputs.prepared_dir)).select([0]).save_to_disk(str(one))
    with pytest.raises(TrainInputError, match="cannot split"):
        run_train(inputs, tmp_path / "out", prepared_dir=one)


def test_vocab_mapping_of_the_wrong_size_is_refused_naming_the_file(inputs):
    with pytest.raises(TrainInputError, match=str(inputs.d2t_path)):
        build_draft_model(target_dir=inputs.target_dir, layer_ids=inputs.layer_ids, d2t_path=inputs.d2t_path,
                          t2d_path=inputs.t2d_path, draft_vocab_size=DRAFT_VOCAB * 2, ttt_steps=3)
    assert read_target_config(inputs.target_dir).hidden_size == 128


def test_a_one_token_row_is_counted_unusable_and_adds_no_available_tokens(inputs, tmp_path):
    from datasets import Dataset, load_from_disk
    from safetensors.torch import load_file, save_file

    from workers.stages.train.holdout.prompt_keys import read_prompt_keys
    from workers.stages.train.holdout.split import split_train_val

    rows = load_from_disk(str(inputs.prepared_dir)).with_format(None).to_dict()
    first = load_file(str(inputs.hidden_states_dir / "hs_0.safetensors"))
    rows["input_ids"].append(rows["input_ids"][0][:1])
    rows["loss_mask"].append([1])  # an imported row may mask position 0; nothing can predict it
    rows["seq_len"].append(1)
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "prepared"))
    hs_dir = tmp_path / "hidden_states"
    shutil.copytree(inputs.hidden_states_dir, hs_dir)
    save_file({"token_ids": first["token_ids"][:1].contiguous(),
               "hidden_states": first["hidden_states"][:1].contiguous()}, str(hs_dir / f"hs_{NUM_ROWS}.safetensors"))
    keys = read_prompt_keys(tmp_path / "prepared")  # the split train() makes: held out by prompt content
    seed = next(s for s in range(20) if NUM_ROWS in split_train_val(None, val_fraction=0.1, seed=s,
                                                                     num_rows=NUM_ROWS + 1, prompt_keys=keys)[0])
    result = run_train(inputs, tmp_path / "out", prepared_dir=tmp_path / "prepared", hidden_states_dir=hs_dir,
                       epochs=1, seed=seed)
    assert result.rows_unusable == 1
    assert result.loss_tokens_trained == result.loss_tokens_available > 0
