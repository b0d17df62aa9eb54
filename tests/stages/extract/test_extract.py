"""The extract stage: hidden states in speculators 0.9's layout plus a flat data_config.json."""
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from workers.stages.extract import with_transformers as extract_module
from workers.stages.extract.output.files import HiddenBatch, _check_batch
from workers.stages.extract.batch_plan import batch_token_budget, open_prepared, plan_forward_batches
from workers.stages.extract.with_transformers import extract, iter_hidden_states
from workers.stages.extract.model import load_target
from workers.stages.prepare.stage import prepare
from workers.contract.target import TargetConfigError, default_layer_ids

SUBSET = 10
CHECK_SCRIPT = Path(__file__).resolve().parents[4] / "shared" / "tools" / "check_run_outputs.py"


@pytest.fixture(scope="module")
def prepared(tiny_target, tmp_path_factory):
    lines = tiny_target.chats_path.read_text().splitlines()[:SUBSET]
    root = tmp_path_factory.mktemp("extract")
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    return prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=root / "chats.jsonl",
                   out_dir=root / "prepared", max_seq_len=128)


@pytest.fixture(scope="module")
def layer_ids(tiny_target):
    return default_layer_ids(tiny_target.num_layers)  # [2, 4, 5, 8]


@pytest.fixture(scope="module")
def extracted(tiny_target, prepared, layer_ids, tmp_path_factory):
    calls = []
    result = extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                     out_dir=tmp_path_factory.mktemp("hs") / "run", layer_ids=layer_ids, device="cpu",
                     on_progress=lambda done, total: calls.append((done, total)))
    return result, calls


@pytest.fixture(scope="module")
def model(tiny_target):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_target.target_dir), dtype=torch.float32,
                                                local_files_only=True).eval()


def _rows(prepared):
    from datasets import load_from_disk

    return load_from_disk(str(prepared.out_dir)).with_format(None)


def test_one_file_per_row_with_speculators_keys_dtypes_and_shapes(extracted, prepared, layer_ids, tiny_target):
    result, _ = extracted
    rows = _rows(prepared)
    names = sorted(p.name for p in result.hidden_states_dir.iterdir())
    assert names == sorted(f"hs_{i}.safetensors" for i in range(len(rows)))
    for i, row in enumerate(rows):
        data = load_file(result.hidden_states_dir / f"hs_{i}.safetensors")
        assert set(data) == {"token_ids", "hidden_states"}
        assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == row["input_ids"]
        assert data["hidden_states"].dtype == torch.bfloat16
        assert tuple(data["hidden_states"].shape) == (row["seq_len"], len(layer_ids), tiny_target.hidden_size)


def test_speculators_arrow_dataset_reads_the_extraction(extracted, prepared, tiny_target):
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    result, _ = extracted
    reader = ArrowDataset(max_len=128, datapath=prepared.out_dir, on_missing="raise",
                          transfer=FileTransfer(result.hidden_states_dir))
    sample = reader[1]
    seq_len, hidden = _rows(prepared)[1]["seq_len"], tiny_target.hidden_size
    assert tuple(sample["hidden_states"].shape) == (seq_len, 3 * hidden)
    assert tuple(sample["verifier_last_hidden_states"].shape) == (seq_len, hidden)
    assert sample["loss_mask"].tolist() == _rows(prepared)[1]["loss_mask"]


def test_aux_layers_equal_hf_hidden_states_and_last_layer_is_pre_final_norm(extracted, prepared, layer_ids, model):
    result, _ = extracted
    ids = torch.tensor([_rows(prepared)[0]["input_ids"]])
    with torch.no_grad():
        hf = model(input_ids=ids, output_hidden_states=True).hidden_states
    stored = load_file(result.hidden_states_dir / "hs_0.safetensors")["hidden_states"].float()
    for k, lid in enumerate(layer_ids[:-1]):
        torch.testing.assert_close(stored[:, k], hf[lid][0], rtol=2e-2, atol=2e-2)
    last = stored[:, -1]
    # transformers ties hidden_states[N] to the post-norm output; the stored tensor is its input,
    # which Eagle3DraftModel's verifier_norm normalises itself.
    with torch.no_grad():
        torch.testing.assert_close(model.model.norm(last), hf[-1][0], rtol=3e-2, atol=3e-2)
    assert not torch.allclose(last, hf[-1][0], atol=1e-1)


def test_manifest_has_every_flat_field_and_agrees_with_files(extracted, layer_ids, tiny_target):
    result, _ = extracted
    man = json.loads(result.manifest_path.read_text())
    assert man["layer_ids"] == layer_ids and man["num_layers_captured"] == len(layer_ids)
    assert man["data_format_version"] == 1 and man["tp_size"] == 1 and man["max_seq_len"] == 128
    assert man["hidden_size"] == tiny_target.hidden_size
    assert man["total_samples"] == result.num_samples == len(list(result.hidden_states_dir.iterdir()))
    assert man["total_tokens"] == result.total_tokens
    assert man["layer_id_convention"] == "hf_hidden_states_index"
    assert man["file_pattern"] == "hidden_states/hs_{idx}.safetensors"
    assert man["dtype"] == "bfloat16" and man["device"] == "cpu" == result.device
    for key in ("model_load_seconds", "forward_seconds", "tokens_per_second", "bytes_on_disk", "created_at"):
        assert key in man


def test_reviewer_check_finds_no_extraction_problem(extracted, tiny_target, tmp_path, monkeypatch, capsys):
    if not CHECK_SCRIPT.exists():
        pytest.skip(f"{CHECK_SCRIPT} is not beside this checkout")
    result, _ = extracted
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"extraction": {"manifest": str(result.manifest_path)}}))
    # In-process: a fresh interpreter would spend ~15 s re-importing speculators.
    monkeypatch.setattr(sys, "argv", [str(CHECK_SCRIPT), str(summary), str(tiny_target.target_dir)])
    with pytest.raises(SystemExit):
        runpy.run_path(str(CHECK_SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM")]
    # This stage writes no checkpoint; that is the train stage's line (its wording is the tool's).
    assert len(problems) == 1 and problems[0].startswith("PROBLEM: no ") and "checkpoint" in problems[0], problems
    assert f"{result.num_samples} samples, {result.total_tokens} tokens" in out


def test_bytes_per_token_stay_within_ten_percent_of_the_floor(extracted, layer_ids, tiny_target):
    result, _ = extracted
    assert result.floor_bytes_per_token == len(layer_ids) * tiny_target.hidden_size * 2
    on_disk = sum(p.stat().st_size for p in result.hidden_states_dir.iterdir())
    assert result.bytes_on_disk == on_disk
    assert result.floor_bytes_per_token <= result.bytes_per_token <= 1.10 * result.floor_bytes_per_token


def test_one_row_per_forward_matches_batched_forward(extracted, tiny_target, prepared, layer_ids, tmp_path):
    result, _ = extracted
    single = extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=tmp_path / "one",
                     layer_ids=layer_ids, device="cpu", batch_tokens=1)
    for i in range(3):
        a = load_file(single.hidden_states_dir / f"hs_{i}.safetensors")["hidden_states"].float()
        b = load_file(result.hidden_states_dir / f"hs_{i}.safetensors")["hidden_states"].float()
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_batches_respect_the_token_budget():
    lengths = [5, 40, 12, 39, 7, 100]
    batches = plan_forward_batches(lengths, batch_tokens=80)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 80 or len(b) == 1 for b in batches)


def test_invalid_layer_ids_are_rejected_before_loading_the_model(tiny_target, prepared, tmp_path, monkeypatch):
    monkeypatch.setattr(extract_module, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(TargetConfigError, match=r"\[9\] are outside this target"):
        extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=tmp_path / "o",
                layer_ids=[2, 4, 9], device="cpu")
    assert not (tmp_path / "o").exists()


def test_refuses_a_non_empty_output_directory(tiny_target, prepared, tmp_path, layer_ids):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=tmp_path / "o",
                layer_ids=layer_ids, device="cpu")


def test_progress_ends_at_the_row_count(extracted):
    result, calls = extracted
    assert calls[-1] == (result.num_samples, result.num_samples)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_headers_name_layers_and_width_without_loading_data(extracted, layer_ids, tiny_target):
    result, _ = extracted
    with safe_open(str(result.hidden_states_dir / "hs_0.safetensors"), "pt") as f:
        shape = f.get_slice("hidden_states").get_shape()
    assert shape[1:] == [len(layer_ids), tiny_target.hidden_size]


def test_iter_hidden_states_yields_exactly_what_extract_writes(extracted, prepared, layer_ids, tiny_target):
    """The benchmark's bare loop drives this generator; it must be the stage's own batches."""
    result, _ = extracted
    data, lengths = open_prepared(prepared.out_dir)
    device = torch.device("cpu")
    model = load_target(tiny_target.target_dir, device)
    budget = batch_token_budget(device.type)
    seen = []
    for batch in iter_hidden_states(model, data, lengths, budget, layer_ids, device):
        assert batch.hidden.dtype == torch.bfloat16 and batch.hidden.device.type == "cpu"
        assert tuple(batch.hidden.shape) == (len(batch.indices), max(map(len, batch.rows)), len(layer_ids),
                                             tiny_target.hidden_size)
        for b, (i, row) in enumerate(zip(batch.indices, batch.rows)):
            stored = load_file(result.hidden_states_dir / f"hs_{i}.safetensors")
            assert stored["token_ids"].tolist() == row
            assert torch.equal(stored["hidden_states"], batch.hidden[b, : len(row)])
        seen.append(batch.indices)
    assert seen == plan_forward_batches(lengths, budget)
    assert not any(m._forward_pre_hooks for m in model.modules()), "hooks left on the model"


def test_a_background_writer_writes_the_same_files(extracted, tiny_target, prepared, layer_ids, tmp_path,
                                                   monkeypatch):
    """Accelerators write on a thread while the next batch runs; the files must not change."""
    from concurrent.futures import ThreadPoolExecutor

    result, _ = extracted
    monkeypatch.setattr(extract_module, "_writer", lambda device: ThreadPoolExecutor(max_workers=1))
    threaded = extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=tmp_path / "t",
                       layer_ids=layer_ids, device="cpu")
    assert threaded.bytes_on_disk == result.bytes_on_disk and threaded.total_tokens == result.total_tokens
    for i in range(result.num_samples):
        name = f"hs_{i}.safetensors"
        assert (threaded.hidden_states_dir / name).read_bytes() == (result.hidden_states_dir / name).read_bytes()
    assert sorted(p.name for p in threaded.hidden_states_dir.iterdir()) == sorted(
        p.name for p in result.hidden_states_dir.iterdir())


def test_rows_whose_seq_len_disagrees_are_refused_before_loading_the_model(tmp_path, monkeypatch, tiny_target,
                                                                          layer_ids):
    from datasets import Dataset

    Dataset.from_dict({"input_ids": [[5, 6, 7], [8]], "seq_len": [3, 2]}).save_to_disk(str(tmp_path / "p"))
    monkeypatch.setattr(extract_module, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(ValueError, match=r"row 1 has seq_len 2 and 1 input_ids"):
        extract(target_dir=tiny_target.target_dir, prepared_dir=tmp_path / "p", out_dir=tmp_path / "o",
                layer_ids=layer_ids, device="cpu")


def test_non_finite_hidden_states_name_their_row():
    hidden = torch.zeros(2, 3, 1, 4, dtype=torch.bfloat16)
    _check_batch(HiddenBatch([4, 9], [[1, 2, 3], [1, 2]], hidden, 0.0))
    hidden[1, 1, 0, 2] = float("nan")
    with pytest.raises(ValueError, match=r"hs_9\.safetensors: .*non-finite"):
        _check_batch(HiddenBatch([4, 9], [[1, 2, 3], [1, 2]], hidden, 0.0))
