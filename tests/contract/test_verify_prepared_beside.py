"""A speculators 0.9 directory is verified against the prepared dataset it carries.

Built the way upstream lays it out: `speculators prepare-data` saves a torch-formatted dataset
with `save_to_disk` (cli/prepare_data.py:243, preprocessing.py:638), and `generate-offline-data`
writes `hidden_states/hs_{i}.safetensors` inside it, file i for row i. Upstream's own file check
(`speculators.data_generation.offline.check_hidden_states`) is run on the same files, so the
verdicts are compared with upstream's, not only with ours.
"""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from workers.contract.extraction.layout import detect_layout, prepared_beside
from workers.contract.extraction.verify import verify_extraction

H, L, N = 16, 4, 8
LENGTHS = [6, 11, 4, 9]


@pytest.fixture
def target(tmp_path) -> Path:
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_hidden_layers": N, "hidden_size": H, "vocab_size": 100}))
    return d


def write_upstream_09(root: Path, *, reverse: int | None = None, rows: int | None = None) -> Path:
    """prepare-data's dataset at root, generate-offline-data's files in root/hidden_states.

    `reverse`: the file of that index holds its row's token ids reversed (same length, so every
    shape check passes). `rows`: how many rows the dataset keeps (default: one per file)."""
    from datasets import Dataset

    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 100, (t,), generator=gen) for t in LENGTHS]
    n = len(LENGTHS) if rows is None else rows
    extra = [torch.randint(0, 100, (5,), generator=gen) for _ in range(max(0, n - len(ids)))]
    table = ids[:n] + extra
    ds = Dataset.from_dict({"input_ids": [t.tolist() for t in table],
                            "loss_mask": [[0] * (len(t) // 2) + [1] * (len(t) - len(t) // 2) for t in table],
                            "seq_len": [len(t) for t in table]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(root))
    (root / "hidden_states").mkdir()
    for i, t in enumerate(ids):
        token_ids = t.flip(0) if i == reverse else t
        hs = torch.randn(len(t), L, H, generator=gen).to(torch.bfloat16)
        save_file({"token_ids": token_ids, "hidden_states": hs}, str(root / "hidden_states" / f"hs_{i}.safetensors"))
    return root


def _upstream_verdicts(root: Path) -> dict[int, bool]:
    from datasets import load_from_disk

    from speculators.data_generation.offline import check_hidden_states

    data = load_from_disk(str(root))
    verdicts = {}
    for i in range(len(LENGTHS)):
        try:
            check_hidden_states(load_file(str(root / "hidden_states" / f"hs_{i}.safetensors")),
                                data[i]["input_ids"].tolist())
            verdicts[i] = True
        except ValueError:
            verdicts[i] = False
    return verdicts


def test_the_dataset_beside_upstream_hidden_states_is_found_from_either_folder(tmp_path):
    root = write_upstream_09(tmp_path / "prepared")
    assert prepared_beside(detect_layout(root)) == root
    assert prepared_beside(detect_layout(root / "hidden_states")) == root


def test_a_good_upstream_directory_passes_the_token_id_check_against_its_dataset(tmp_path, target):
    root = write_upstream_09(tmp_path / "prepared")
    assert all(_upstream_verdicts(root).values())
    report = verify_extraction(root, target_dir=target)
    check = report.check("prepared_tokens")
    assert check.verdict == "pass" and str(root) in check.message
    assert report.passed and report.prepared_dir == root and report.prepared_source == "beside the hidden states"


def test_reversed_token_ids_fail_verification_naming_the_sample(tmp_path, target):
    root = write_upstream_09(tmp_path / "prepared", reverse=2)
    assert _upstream_verdicts(root) == {0: True, 1: True, 2: False, 3: True}  # upstream agrees
    for entry in (root, root / "hidden_states"):
        report = verify_extraction(entry, target_dir=target)
        check = report.check("prepared_tokens")
        assert not report.passed and check.verdict == "fail"
        assert check.offending_files == ["hs_2.safetensors"]
        assert check.message.startswith("hs_2.safetensors: token ids differ from row 2 of the prepared dataset")


def test_hidden_states_without_a_dataset_beside_skip_the_check_and_say_why(tmp_path, target):
    root = write_upstream_09(tmp_path / "prepared")
    moved = tmp_path / "elsewhere" / "hidden_states"
    moved.parent.mkdir()
    (root / "hidden_states").rename(moved)
    check = verify_extraction(moved.parent, target_dir=target).check("prepared_tokens")
    assert check.verdict == "skip" and "beside the hidden states" in check.message


def test_a_dataset_with_more_rows_than_files_warns_when_the_files_match(tmp_path, target):
    root = write_upstream_09(tmp_path / "prepared", rows=len(LENGTHS) + 2)  # generate-offline-data --max-samples
    report = verify_extraction(root, target_dir=target)
    check = report.check("prepared_tokens")
    assert check.verdict == "warn" and f"{len(LENGTHS) + 2} rows, {len(LENGTHS)} sample files" in check.message
    assert report.passed


def test_an_unreadable_dataset_beside_fails_the_check_naming_its_file(tmp_path, target):
    root = write_upstream_09(tmp_path / "prepared")
    (root / "state.json").write_text("{broken")
    check = verify_extraction(root, target_dir=target).check("prepared_tokens")
    assert check.verdict == "fail" and str(root / "state.json") in check.message
