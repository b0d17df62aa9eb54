"""Verifying hidden-state extractions users bring: three layouts, and every way their manifests and counts can
lie. How the files themselves are read (headers, pickles, fp8): test_verify_reading.py. The writers here
(write_09, write_flat, write_v04) make the small extractions other tests import."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workers.contract.extraction.layout import LayoutError, ManifestError, detect_layout, read_manifest
from workers.contract.extraction.verify import verify_extraction

H, L, N = 16, 4, 8  # hidden size, layers captured, target decoder layers
LENGTHS = [5, 9, 3, 7]


def _sample(i: int, t: int, width: int = H, layers: int = L):
    gen = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 100, (t,), generator=gen)
    return ids, torch.randn(t, layers, width, generator=gen).to(torch.bfloat16)


def write_09(root: Path, lengths=LENGTHS) -> Path:
    (root / "hidden_states").mkdir(parents=True)
    for i, t in enumerate(lengths):
        ids, hs = _sample(i, t)
        save_file({"token_ids": ids, "hidden_states": hs}, str(root / "hidden_states" / f"hs_{i}.safetensors"))
    return root


def flat_manifest(**over) -> dict:
    m = {"model_path": "/models/tiny", "layer_ids": [2, 4, 5, 7], "max_seq_len": 64, "tp_size": 1,
         "total_samples": len(LENGTHS), "total_tokens": sum(LENGTHS), "total_time_seconds": 1.5,
         "data_format_version": 1, "hidden_size": H, "num_layers_captured": L}
    m.update(over)
    return m


def write_flat(root: Path, **over) -> Path:
    write_09(root)
    (root / "data_config.json").write_text(json.dumps(flat_manifest(**over)))
    return root


def v04_manifest(**over) -> dict:
    m = {"version": "2.0", "generated_at": "2025-01-01T00:00:00", "speculators_version": "0.4.0",
         "model": {"target_model_path": "/models/tiny", "tensor_parallel_size": 1,
                   "gpu_memory_utilization": 0.9, "hidden_size": H},
         "data": {"train_data_path": "x.jsonl", "seq_length": 64, "max_samples": None,
                  "num_samples": len(LENGTHS), "seed": 0},
         "hidden_states": {"layer_ids": [2, 4, 5, 7], "description": "x"},
         "generation": {"cache_dir": "/tmp"}, "format": {"file_pattern": "data_{idx}.pt", "schema": {}}}
    m.update(over)
    return m


def write_v04(root: Path, manifest: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(LENGTHS):
        ids, hs = _sample(i, t)
        torch.save({"input_ids": ids, "hidden_states": [hs[:, k].contiguous() for k in range(L)],
                    "loss_mask": torch.ones(t, dtype=torch.long)}, root / f"data_{i}.pt")
    (root / "sample_lengths.json").write_text(json.dumps({str(i): t for i, t in enumerate(LENGTHS)}))
    (root / "data_config.json").write_text(json.dumps(manifest or v04_manifest()))
    return root


@pytest.fixture
def target(tmp_path) -> Path:
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_hidden_layers": N, "hidden_size": H, "vocab_size": 100}))
    return d


def _fail(report, name):
    check = report.check(name)
    assert check.verdict == "fail", (name, check)
    return check


@pytest.mark.parametrize("writer,layout", [(write_09, "speculators_09"), (write_flat, "flat_v1"),
                                           (write_v04, "speculators_v04")])
def test_each_layout_is_detected_and_passes_in_both_modes(tmp_path, target, writer, layout):
    root = writer(tmp_path / "x")
    assert detect_layout(root).name == layout
    for full in (False, True):
        report = verify_extraction(root, target_dir=target, full=full)
        assert report.passed, [c for c in report.checks if c.verdict == "fail"]
        assert report.layout == layout
        assert report.num_files == 4 and report.total_tokens == sum(LENGTHS)
        assert report.floor_bytes_per_token == L * H * 2
        assert sum(b["count"] for b in report.length_histogram) == 4
    assert report.check("finite").verdict == "pass"


def test_speculators_09_claims_are_synthesised_and_assume_default_ids(tmp_path, target):
    root = write_09(tmp_path / "x")
    claims = read_manifest(root, detect_layout(root))
    assert claims.synthesised and claims.hidden_size == H and claims.num_layers_captured == L
    report = verify_extraction(root, target_dir=target)
    assert report.claims.layer_ids == [2, 4, 5, 8]
    assert "speculators 0.9" in report.claims.layer_id_convention_reason


def test_field_scripts_n_minus_1_convention_is_named(tmp_path, target):
    report = verify_extraction(write_flat(tmp_path / "x"), target_dir=target)
    assert report.claims.layer_id_convention == "last_is_n_minus_1"
    assert "N-1" in report.claims.layer_id_convention_reason


def test_specforge_ids_are_recognised(tmp_path, target):
    report = verify_extraction(write_flat(tmp_path / "x", layer_ids=[1, 3, 4, 7]), target_dir=target)
    assert report.passed and report.claims.layer_id_convention == "specforge_layer_outputs"


def test_file_count_mismatch_names_manifest_and_numbers(tmp_path, target):
    report = verify_extraction(write_flat(tmp_path / "x", total_samples=5), target_dir=target)
    check = _fail(report, "sample_count")
    assert "data_config.json" in check.message and "5" in check.message and "4 sample files" in check.message


def test_token_total_mismatch(tmp_path, target):
    report = verify_extraction(write_flat(tmp_path / "x", total_tokens=30), target_dir=target)
    check = _fail(report, "token_total")
    assert "data_config.json" in check.message and "30" in check.message and "24" in check.message


def test_wrong_width_names_file(tmp_path, target):
    root = write_flat(tmp_path / "x")
    ids, hs = _sample(2, 3, width=8)
    save_file({"token_ids": ids, "hidden_states": hs}, str(root / "hidden_states" / "hs_2.safetensors"))
    report = verify_extraction(root, target_dir=target)
    check = _fail(report, "hidden_size")
    assert check.offending_files == ["hs_2.safetensors"] and "hidden size 8" in check.message
    assert _fail(report, "target_hidden_size").offending_files == ["hs_2.safetensors"]


def test_wrong_layer_count_names_file(tmp_path, target):
    root = write_flat(tmp_path / "x")
    ids, hs = _sample(1, 9, layers=3)
    save_file({"token_ids": ids, "hidden_states": hs}, str(root / "hidden_states" / "hs_1.safetensors"))
    check = _fail(verify_extraction(root, target_dir=target), "layer_count")
    assert "hs_1.safetensors" in check.message and "layer count 3" in check.message and "4" in check.message


def test_layer_id_out_of_range(tmp_path, target):
    report = verify_extraction(write_flat(tmp_path / "x", layer_ids=[2, 4, 5, 9]), target_dir=target)
    check = _fail(report, "layer_ids")
    assert "[9]" in check.message and "8-layer" in check.message and "data_config.json" in check.message


def test_truncated_safetensors_file(tmp_path, target):
    root = write_09(tmp_path / "x")
    path = root / "hidden_states" / "hs_3.safetensors"
    path.write_bytes(path.read_bytes()[:-40])
    check = _fail(verify_extraction(root, target_dir=target), "readable")
    assert check.offending_files == ["hs_3.safetensors"] and "hs_3.safetensors" in check.message


def test_nans_caught_in_full_mode_only(tmp_path, target):
    root = write_flat(tmp_path / "x")
    ids, hs = _sample(0, 5)
    hs[2, 1, 3] = float("nan")
    save_file({"token_ids": ids, "hidden_states": hs}, str(root / "hidden_states" / "hs_0.safetensors"))
    assert verify_extraction(root, target_dir=target).passed
    check = _fail(verify_extraction(root, target_dir=target, full=True), "finite")
    assert check.offending_files == ["hs_0.safetensors"] and "NaN" in check.message


def test_missing_index(tmp_path, target):
    root = write_flat(tmp_path / "x")
    (root / "hidden_states" / "hs_1.safetensors").unlink()
    check = _fail(verify_extraction(root, target_dir=target), "indices")
    assert "missing indices [1]" in check.message and "hs_1" in check.message


def test_duplicate_index(tmp_path, target):
    root = write_09(tmp_path / "x")
    (root / "hidden_states" / "hs_01.safetensors").write_bytes((root / "hidden_states" / "hs_1.safetensors").read_bytes())
    check = _fail(verify_extraction(root, target_dir=target), "indices")
    assert "hs_01.safetensors" in check.offending_files and "duplicate" in check.message


def test_malformed_manifest_json(tmp_path):
    root = write_09(tmp_path / "x")
    (root / "data_config.json").write_text('{"data_format_version": 1,')
    with pytest.raises(ManifestError, match=r"data_config.json: not valid JSON.*line 1"):
        detect_layout(root)


def test_missing_field(tmp_path):
    root = write_09(tmp_path / "x")
    m = flat_manifest()
    del m["total_tokens"]
    (root / "data_config.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=r"data_config.json: field 'total_tokens' is missing"):
        read_manifest(root, detect_layout(root))


def test_wrong_field_type(tmp_path):
    root = write_flat(tmp_path / "x", hidden_size="16")
    with pytest.raises(ManifestError, match=r"field 'hidden_size' must be int, got '16'"):
        read_manifest(root, detect_layout(root))


def test_missing_nested_field_in_v04(tmp_path):
    m = v04_manifest()
    del m["model"]["hidden_size"]
    root = write_v04(tmp_path / "x", m)
    with pytest.raises(ManifestError, match=r"data_config.json: field 'model.hidden_size' is missing"):
        read_manifest(root, detect_layout(root))


def test_unknown_flat_version(tmp_path):
    root = write_flat(tmp_path / "x", data_format_version=2)
    with pytest.raises(ManifestError, match=r"data_config.json: field 'data_format_version' is 2"):
        detect_layout(root)


def test_unknown_nested_version(tmp_path):
    root = write_v04(tmp_path / "x", v04_manifest(version="3.0"))
    with pytest.raises(ManifestError, match=r"data_config.json: field 'version' is '3.0'"):
        detect_layout(root)


def test_unknown_layout_names_directory_and_contents(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("hi")
    with pytest.raises(LayoutError, match=r"x: not a known extraction layout.*notes.txt"):
        detect_layout(tmp_path / "x")


def test_v04_sample_lengths_disagreement(tmp_path, target):
    root = write_v04(tmp_path / "x")
    (root / "sample_lengths.json").write_text(json.dumps({"0": 5, "1": 9, "2": 4, "3": 7}))
    report = verify_extraction(root, target_dir=target)
    check = _fail(report, "sample_lengths")
    assert "data_2.pt: 3 tokens" in check.message and "4" in check.message


def test_prepared_token_ids_compared_row_by_row(tmp_path, target):
    from datasets import Dataset

    root = write_09(tmp_path / "x")
    rows = [_sample(i, t)[0].tolist() for i, t in enumerate(LENGTHS)]
    Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "prep"))
    assert verify_extraction(root, target_dir=target, prepared_dir=tmp_path / "prep").check("prepared_tokens").verdict == "pass"
    rows[2] = [r + 1 for r in rows[2]]
    Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "prep2"))
    check = _fail(verify_extraction(root, target_dir=target, prepared_dir=tmp_path / "prep2"), "prepared_tokens")
    assert check.offending_files == ["hs_2.safetensors"] and "row 2" in check.message


def test_progress_reaches_total_and_no_target_skips_bounds(tmp_path):
    calls = []
    report = verify_extraction(write_flat(tmp_path / "x"), target_dir=None, on_progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (4, 4) and report.passed
    assert report.check("layer_ids").verdict == "skip" and report.samples_per_s > 0


def test_our_extract_manifest_uses_its_recorded_convention(tmp_path, target):
    root = write_flat(tmp_path / "x", layer_ids=[2, 4, 5, 8], dtype="bfloat16",
                      layer_id_convention="hf_hidden_states_index", file_pattern="hidden_states/hs_{idx}.safetensors")
    report = verify_extraction(root, target_dir=target)
    assert report.passed and report.claims.layer_id_convention_reason == "recorded in the manifest"
    assert report.check("layer_ids").measured == "0..8"


def test_nested_text_config_target_is_read(tmp_path):
    target = tmp_path / "mm"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["Mllama"], "hidden_size": 4096,
                                                    "text_config": {"num_hidden_layers": N, "hidden_size": H,
                                                                    "vocab_size": 100}}))
    report = verify_extraction(write_flat(tmp_path / "x"), target_dir=target)
    assert report.passed and report.target.nested_text_config
