"""The speculators training backend on a run our own prepare / extract / vocab stages wrote from the demo
target: speculators' dataset reads the run through its data link, and speculators' Trainer runs for
real under torchrun, is stopped, and resumes.

speculators 0.9 cannot run on a host without an accelerator (no device option; see
tests/stages/train/with_speculators/speculators_cpu_seam/sitecustomize.py). Tests named `..._cpu_device_patched` run it
with that test-only seam on the subprocess's PYTHONPATH, which maps its device-0 calls to the CPU; the
command line, data, model, loss, DDP, metric records, checkpoints and resume are speculators' own."""
import json
import re
import shutil
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workers.stages.extract.with_transformers import extract
from workers.stages.prepare.stage import prepare
from workers.contract.extraction.speculators_layout import SpeculatorsLayoutError, run_data_link, speculators_data_link
from workers.stages.train.with_speculators.plan import plan_epochs, read_rows
from workers.contract.target import default_layer_ids
from workers.stages.train.results import TrainingStopped
from workers.stages.train.data import TrainInputError
from workers.stages.train.with_speculators.trainer import SpeculatorsTrainError, speculators_command, train_with_speculators
from workers.stages.vocab import build_vocab

SEAM = Path(__file__).resolve().parent / "speculators_cpu_seam"
CPU_SEAM_ENV = {"EAGLE3WEB_TEST_CPU_AS_DEVICE": "1", "PYTHONPATH": str(SEAM), "OMP_NUM_THREADS": "1"}
# Eager attention and loss: speculators' defaults (flex attention, fused loss) are GPU kernels.
CPU_ARGS = ["--draft-attn-impl", "eager", "--loss-implementation", "eager", "--num-workers", "0"]
DRAFT_VOCAB = 64
EPOCHS = 3


@pytest.fixture(scope="module")
def run_dir(tiny_target, tmp_path_factory):
    return pipeline_run_folder(tiny_target, tmp_path_factory.mktemp("spec-run"))


def pipeline_run_folder(tiny_target, root: Path) -> dict:
    """A run folder as the pipeline leaves it, under root/run: prepared/, extraction/hidden_states/, vocab/
    from the first 20 chats (tests/client's cluster starts from one too)."""
    lines = tiny_target.chats_path.read_text().splitlines()[:20]
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    run = root / "run"
    prepared = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=root / "chats.jsonl",
                       out_dir=run / "prepared", max_seq_len=256)
    layer_ids = default_layer_ids(tiny_target.num_layers)
    extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=run / "extraction",
            layer_ids=layer_ids, device="cpu")
    vocab = build_vocab(token_freq_path=prepared.token_freq_path, out_dir=run / "vocab",
                        draft_vocab_size=DRAFT_VOCAB, target_vocab_size=tiny_target.vocab_size)
    return {"run": run, "target_dir": tiny_target.target_dir, "prepared_dir": prepared.out_dir,
            "hidden_states_dir": run / "extraction" / "hidden_states", "d2t_path": vocab.d2t_path,
            "t2d_path": vocab.t2d_path, "layer_ids": layer_ids}


def _inputs(run_dir) -> dict:
    return {k: run_dir[k] for k in ("target_dir", "prepared_dir", "hidden_states_dir", "d2t_path", "t2d_path",
                                    "layer_ids")}


def test_speculators_dataset_reads_a_run_through_its_data_link(run_dir):
    from datasets import load_from_disk
    from speculators.train.cli import parse_vocab_mappings
    from speculators.train.data import ArrowDataset

    data = speculators_data_link(prepared_dir=run_dir["prepared_dir"], hidden_states_dir=run_dir["hidden_states_dir"],
                                 d2t_path=run_dir["d2t_path"], t2d_path=run_dir["t2d_path"],
                                 out_dir=run_dir["run"] / "speculators_data")
    # The class and the arguments `speculators train --data-path` builds its train loader with.
    dataset = ArrowDataset(max_len=256, datapath=str(data.data_dir), on_missing="raise", train_ratio=1.0,
                           split="train")
    rows = load_from_disk(str(run_dir["prepared_dir"])).with_format(None)
    assert len(dataset) == len(rows) > 20
    for i in range(len(rows)):
        item = dataset[i]
        saved = load_file(str(run_dir["hidden_states_dir"] / f"hs_{i}.safetensors"))
        assert torch.equal(item["input_ids"], torch.tensor(rows[i]["input_ids"]))
        assert torch.equal(item["loss_mask"], torch.tensor(rows[i]["loss_mask"]))
        assert torch.equal(item["hidden_states"], saved["hidden_states"][:, :-1].flatten(1))
        assert torch.equal(item["verifier_last_hidden_states"], saved["hidden_states"][:, -1])
    d2t, t2d, size = parse_vocab_mappings(Namespace(
        d2t_path=None, t2d_path=None, data_path=str(data.data_dir), draft_vocab_size=DRAFT_VOCAB,
        token_freq_path=None, verifier_name_or_path=str(run_dir["target_dir"]), trust_remote_code=False))
    assert size == data.draft_vocab_size == DRAFT_VOCAB
    assert torch.equal(d2t, torch.from_numpy(np.load(run_dir["d2t_path"])))
    assert torch.equal(t2d, torch.from_numpy(np.load(run_dir["t2d_path"])))
    assert all((data.data_dir / name).is_symlink() for name in data.linked)


def test_data_link_is_rewritten_in_place_and_never_replaces_real_files(run_dir, tmp_path):
    args = dict(prepared_dir=run_dir["prepared_dir"], hidden_states_dir=run_dir["hidden_states_dir"],
                d2t_path=run_dir["d2t_path"], t2d_path=run_dir["t2d_path"])
    first = speculators_data_link(**args, out_dir=tmp_path / "data")
    again = speculators_data_link(**args, out_dir=tmp_path / "data")
    assert first == again and (tmp_path / "data" / "hidden_states" / "hs_0.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no staging folder left behind
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SpeculatorsLayoutError, match="holds more than links"):
        speculators_data_link(**args, out_dir=tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_run_without_speculators_hidden_states_gets_no_link_and_says_why(run_dir, tmp_path, caplog):
    legacy = tmp_path / "extraction"  # e.g. an imported speculators v0.4 extraction: data_{i}.pt, no hidden_states/
    legacy.mkdir()
    made = run_data_link(run_dir=tmp_path, prepared_dir=run_dir["prepared_dir"], hidden_states_dir=legacy / "hidden_states",
                         d2t_path=run_dir["d2t_path"], t2d_path=run_dir["t2d_path"])
    assert made is None and not (tmp_path / "speculators_data").exists()
    assert "hidden states folder not found" in caplog.text
    made = run_data_link(run_dir=tmp_path, prepared_dir=run_dir["prepared_dir"],
                         hidden_states_dir=run_dir["hidden_states_dir"], d2t_path=run_dir["d2t_path"],
                         t2d_path=run_dir["t2d_path"])
    assert made.data_dir == tmp_path / "speculators_data" and made.draft_vocab_size == DRAFT_VOCAB


def test_command_carries_processes_fsdp_and_the_run_paths_for_several_gpus(tmp_path):
    command = speculators_command(
        torchrun="/opt/venv/bin/torchrun", num_gpus=4, fsdp=True, target_dir=Path("/models/target"),
        data_dir=tmp_path / "speculators_data", out_dir=tmp_path / "checkpoints", aux_layer_ids=[2, 16, 29],
        draft_vocab_size=32000, epochs=5, lr=1e-4, ttt_steps=3, seed=7, total_seq_len=8192, train_data_ratio=0.9,
        hidden_states_backend="fp8", extra_args=["--num-workers", "8"])
    assert command[:6] == ["/opt/venv/bin/torchrun", "--standalone", "--nproc-per-node", "4", "-m",
                           "workers.stages.train.with_speculators.entry"]
    flags = " ".join(command[6:])
    for expected in ("--verifier-name-or-path /models/target", f"--data-path {tmp_path / 'speculators_data'}",
                     f"--save-path {tmp_path / 'checkpoints'}", "--target-layer-ids 2 16 29",
                     "--draft-vocab-size 32000", "--epochs 5", "--lr 0.0001", "--ttt-steps 3", "--seed 7",
                     "--total-seq-len 8192", "--train-data-ratio 0.9", "--on-missing raise",
                     "--hidden-states-backend fp8", "--fsdp-shard", "--num-workers 8"):
        assert expected in flags


def test_plan_for_several_processes_gives_each_step_a_batch_per_rank(run_dir):
    rows = read_rows(run_dir["prepared_dir"])
    one = plan_epochs(rows, train_rows=30, total_seq_len=256, world_size=1, seed=0, epochs=2)
    four = plan_epochs(rows, train_rows=30, total_seq_len=256, world_size=4, seed=0, epochs=2)
    assert sum(one.step_tokens[0]) == sum(rows.lengths[:30]) and one.rows_left_out == [0, 0]
    assert four.total_steps < one.total_steps
    for epoch in range(2):  # rows no rank got are counted, the others trained once each
        trained = sum(four.step_tokens[epoch])
        assert trained <= sum(rows.lengths[:30]) and (trained < sum(rows.lengths[:30])) == (four.rows_left_out[epoch] > 0)


def test_missing_hidden_states_are_refused_before_the_trainer_starts(run_dir, tmp_path):
    partial = tmp_path / "hidden_states"
    shutil.copytree(run_dir["hidden_states_dir"], partial)
    (partial / "hs_3.safetensors").unlink()
    with pytest.raises(TrainInputError, match="1 of .* rows have no usable hidden states.*row 3"):
        train_with_speculators(**{**_inputs(run_dir), "hidden_states_dir": partial}, out_dir=tmp_path / "ckpt",
                               epochs=1, lr=1e-3, ttt_steps=2, draft_vocab_size=DRAFT_VOCAB,
                               torchrun_executable="/nonexistent/torchrun")


def test_trainer_refusing_its_flags_fails_with_the_end_of_its_log_cpu_device_patched(run_dir, tmp_path):
    with pytest.raises(SpeculatorsTrainError, match=r"(?s)exited with code \d+.*optimizer"):
        train_with_speculators(**_inputs(run_dir), out_dir=tmp_path / "ckpt", epochs=1, lr=1e-3, ttt_steps=2,
                               draft_vocab_size=DRAFT_VOCAB, data_dir=tmp_path / "data",
                               extra_args=[*CPU_ARGS, "--optimizer", "sgd"], env=CPU_SEAM_ENV)


@pytest.fixture(scope="module")
def stopped_then_resumed(run_dir, tmp_path_factory):
    """speculators' Trainer for 3 epochs, stopped once epoch 0's checkpoint is registered, then run again."""
    out_dir = run_dir["run"] / "checkpoints"
    calls = {"first": {"points": [], "checkpoints": [], "resume": [], "progress": []},
             "second": {"points": [], "checkpoints": [], "resume": [], "progress": []}}

    def attempt(name, env=CPU_SEAM_ENV, **kwargs):
        got = calls[name]
        return train_with_speculators(
            **_inputs(run_dir), out_dir=out_dir, epochs=EPOCHS, lr=3e-3, ttt_steps=3, draft_vocab_size=DRAFT_VOCAB,
            max_tokens_per_step=256, extra_args=CPU_ARGS, env=env, stop_grace_seconds=60,
            on_metrics=got["points"].extend, on_checkpoint=got["checkpoints"].append,
            on_resume=lambda step, epochs_done: got["resume"].append((step, epochs_done)),
            on_progress=lambda done, total: got["progress"].append((done, total)), **kwargs)

    with pytest.raises(TrainingStopped) as stopped:
        # An epoch of this tiny run takes a fraction of a second: paced so that the stop, seen at the
        # trainer's next poll, lands before the last epoch even on a loaded host.
        attempt("first", env={**CPU_SEAM_ENV, "EAGLE3WEB_TEST_SYNC_PAUSE_SECONDS": "0.05"},
                should_stop=lambda: bool(calls["first"]["checkpoints"]))
    calls["stopped"] = stopped.value
    calls["result"] = attempt("second")
    calls["out_dir"] = out_dir
    return calls


def _last_epoch_of_first(stopped_then_resumed) -> int:
    """The last epoch the stopped attempt registered: the stop is asked at the first and seen at the
    trainer's next poll, so it may land an epoch later; never at the end, or nothing was stopped."""
    epochs = [c.epoch for c in stopped_then_resumed["first"]["checkpoints"]]
    assert epochs and epochs[-1] < EPOCHS - 1
    return epochs[-1]


def test_metrics_arrive_as_our_points_unrounded_cpu_device_patched(stopped_then_resumed):
    first = stopped_then_resumed["first"]
    train = [p for p in first["points"] if p["split"] == "train"]
    steps = sorted({p["step"] for p in train})
    assert steps == list(range(1, len(steps) + 1))
    keys = {p["key"] for p in train}
    assert {"loss", "loss_0", "loss_2", "full_acc_0", "cond_acc_2", "lr", "tokens_per_s", "tokens_seen"} <= keys
    assert first["progress"][0] == (0, stopped_then_resumed["result"].steps)
    last = _last_epoch_of_first(stopped_then_resumed)
    val = {p["key"]: p for p in first["points"] if p["split"] == "val" and p["epoch"] == last + 1}
    saved = json.loads((stopped_then_resumed["out_dir"] / str(last) / "val_metrics.json").read_text())
    assert val["loss"]["value"] == saved["loss_epoch"] and val["loss_1"]["value"] == saved["loss_1_epoch"]
    state = json.loads((stopped_then_resumed["out_dir"] / str(last) / "training_state.json").read_text())
    assert val["loss"]["step"] == state["global_step"]


def test_stop_ends_the_trainer_after_a_registered_epoch_cpu_device_patched(stopped_then_resumed):
    first = stopped_then_resumed["first"]
    last = _last_epoch_of_first(stopped_then_resumed)
    assert [c.epoch for c in first["checkpoints"]] == list(range(last + 1))
    assert first["resume"] == [(0, 0)]
    state = json.loads((stopped_then_resumed["out_dir"] / str(last) / "training_state.json").read_text())
    assert stopped_then_resumed["stopped"].steps_done >= state["global_step"]
    # A stopped attempt's interrupt save was removed by the retry: speculators never resumes from it.
    assert not (stopped_then_resumed["out_dir"] / "interrupted").exists()


def test_retry_resumes_with_speculators_own_resume_cpu_device_patched(stopped_then_resumed, run_dir):
    second, result = stopped_then_resumed["second"], stopped_then_resumed["result"]
    last = _last_epoch_of_first(stopped_then_resumed)
    state = json.loads((stopped_then_resumed["out_dir"] / str(last) / "training_state.json").read_text())
    assert second["resume"] == [(state["global_step"], last + 1)]
    assert result.resumed_from_step == state["global_step"] > 0
    train_steps = sorted({p["step"] for p in second["points"] if p["split"] == "train"})
    assert train_steps == list(range(state["global_step"] + 1, result.steps + 1))
    assert [c.epoch for c in second["checkpoints"]] == list(range(last + 1, EPOCHS))
    assert [c.epoch for c in result.checkpoints] == list(range(EPOCHS))
    log = (stopped_then_resumed["out_dir"] / "speculators_train.log").read_text()
    assert f"Resuming training on epoch {last + 1}" in log
    assert result.loss_tokens_trained == result.loss_tokens_available > 0
    # Our split (by conversation, the run's seed, held out by prompt content), which speculators read in
    # split order: its positional boundary falls exactly between the sides.
    assert result.split.by == "conversation" and result.split.held_out_duplicates_removed is not None
    split = json.loads((stopped_then_resumed["out_dir"] / "split.json").read_text())
    rows = read_rows(run_dir["prepared_dir"])
    ids = rows.source_ids
    order = json.loads((run_dir["run"] / "speculators_data_split" / "split_order.json").read_text())["order"]
    assert order == split["train_rows"] + split["val_rows"] and len(split["train_rows"]) == result.split.train_rows
    assert split["sizes"]["val_rows"] == result.split.val_rows == len(ids) - result.split.train_rows
    trained_on = {ids[i] for i in split["train_rows"]}
    assert split["val_rows"] and not {ids[i] for i in split["val_rows"]} & trained_on
    assert not {rows.prompt_keys[i] for i in split["val_rows"]} & {rows.prompt_keys[i] for i in split["train_rows"]}
    ratio = float(re.search(r"--train-data-ratio (\S+)", (result.out_dir / "train_command.txt").read_text())[1])
    assert int(len(ids) * ratio) == result.split.train_rows


def test_checkpoints_are_eagle3_drafts_our_pages_and_vllm_read_cpu_device_patched(stopped_then_resumed, run_dir):
    from speculators.models.eagle3 import Eagle3DraftModel

    result = stopped_then_resumed["result"]
    best = min(result.checkpoints, key=lambda c: c.val_loss)
    assert [c.is_best for c in result.checkpoints] == [c is best for c in result.checkpoints]
    assert (result.out_dir / "checkpoint_best").resolve() == best.path.resolve()
    for ckpt in result.checkpoints:
        config = json.loads((ckpt.path / "config.json").read_text())
        assert config["speculators_model_type"] == "eagle3"
        assert config["eagle_aux_hidden_state_layer_ids"] == run_dir["layer_ids"][:-1]
        assert config["draft_vocab_size"] == DRAFT_VOCAB
        assert config["speculators_config"]["verifier"]["name_or_path"] == str(run_dir["target_dir"])
    draft = Eagle3DraftModel.from_pretrained(str(best.path))
    assert draft.d2t.shape == (DRAFT_VOCAB,)
    command = (result.out_dir / "train_command.txt").read_text()
    assert f"--data-path {run_dir['run'] / 'speculators_data_split'}" in command  # the rows in split order


def test_speculators_trains_with_the_eager_loss_unless_its_flags_say_otherwise():
    """Its fused loss failed under dynamo on an H200 with torch 2.11; eager is what trained there."""
    from workers.stages.train.with_speculators.trainer import speculators_loss_args

    added, said = speculators_loss_args(["--num-workers", "8"])
    assert added == ["--loss-implementation", "eager"] and "eager loss" in said
    for given in (["--loss-implementation", "fused"], ["--loss-implementation=fused"]):
        added, said = speculators_loss_args(given)
        assert added == [] and "as given" in said
