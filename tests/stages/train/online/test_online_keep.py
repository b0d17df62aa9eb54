"""Keep the cache (workers.stages.train.online.keep): a fabricated online cache of real safetensors files,
in the extraction's own format, becomes an extraction that the extraction verifier passes; a cache that
lacks rows, or holds a row's file with other token ids, is refused with the count and nothing is written."""
import json

import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file

from workers.contract.errors import InputError
from workers.contract.extraction.verify import verify_extraction
from workers.stages.train.online.keep import CacheIncomplete, keep_cache_as_extraction

LAYER_IDS = [2, 4, 5, 8]
HIDDEN = 16
ROWS = [[1, 5, 9, 2], [7, 3, 3], [4, 4, 8, 1, 6, 2], [11, 12]]


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "target"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "num_hidden_layers": 8, "hidden_size": HIDDEN, "vocab_size": 100}))
    return path


@pytest.fixture
def prepared(tmp_path):
    path = tmp_path / "prepared"
    Dataset.from_dict({"input_ids": ROWS, "loss_mask": [[1] * len(r) for r in ROWS],
                       "seq_len": [len(r) for r in ROWS]}).save_to_disk(str(path))
    return path


def write_sample(cache, i, ids, *, seed=0):
    generator = torch.Generator().manual_seed(seed + i)
    hidden = torch.randn(len(ids), len(LAYER_IDS), HIDDEN, generator=generator).to(torch.bfloat16)
    save_file({"token_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": hidden},
              str(cache / f"hs_{i}.safetensors"))
    return hidden


def keep(tmp_path, target, prepared, cache):
    return keep_cache_as_extraction(cache_dir=cache, target_dir=target, prepared_dir=prepared,
                                    out_dir=tmp_path / "run" / "extraction", layer_ids=LAYER_IDS, hidden_size=HIDDEN)


def test_a_whole_cache_becomes_an_extraction_the_verifier_passes(tmp_path, target, prepared):
    cache = tmp_path / "run" / "hidden_states_cache"
    cache.mkdir(parents=True)
    written = [write_sample(cache, i, ids) for i, ids in enumerate(ROWS)]
    (cache / "served.json").write_text(json.dumps({"samples": {"0": {"server": "http://a:1", "tokens": 4}}}))

    result = keep(tmp_path, target, prepared, cache)

    out = tmp_path / "run" / "extraction"
    assert result.out_dir == out and result.manifest_path == out / "data_config.json"
    manifest = json.loads((out / "data_config.json").read_text())
    assert (manifest["total_samples"], manifest["total_tokens"]) == (4, 15)  # 4 + 3 + 6 + 2 tokens
    assert (manifest["layer_ids"], manifest["hidden_size"], manifest["dtype"]) == (LAYER_IDS, HIDDEN, "bfloat16")
    assert json.loads((out / "served.json").read_text())["samples"]["0"]["server"] == "http://a:1"
    report = verify_extraction(out, target_dir=target, prepared_dir=prepared, full=True)
    assert [f"{c.name}: {c.message}" for c in report.failures] == []
    assert report.passed and report.num_files == 4 and report.total_tokens == 15
    from safetensors.torch import load_file
    assert torch.equal(load_file(str(out / "hidden_states" / "hs_2.safetensors"))["hidden_states"], written[2])
    # Hard links where the filesystem allows: the cache's later evictions leave the extraction whole.
    (cache / "hs_2.safetensors").unlink()
    assert (out / "hidden_states" / "hs_2.safetensors").stat().st_size > 0


def test_a_cache_missing_rows_is_refused_with_the_count_and_nothing_written(tmp_path, target, prepared):
    cache = tmp_path / "run" / "hidden_states_cache"
    cache.mkdir(parents=True)
    for i in (0, 2):  # rows 1 and 3 were evicted
        write_sample(cache, i, ROWS[i])
    with pytest.raises(CacheIncomplete, match=r"holds 2 of 4 prepared rows whole: 2 missing \(rows 1, 3\)"):
        keep(tmp_path, target, prepared, cache)
    assert not (tmp_path / "run" / "extraction").exists()
    assert not (tmp_path / "run" / "extraction.keeping").exists()


def test_a_file_with_another_rows_tokens_counts_as_missing(tmp_path, target, prepared):
    cache = tmp_path / "run" / "hidden_states_cache"
    cache.mkdir(parents=True)
    for i, ids in enumerate(ROWS):
        write_sample(cache, i, ids if i != 1 else [7, 3, 4])  # row 1's file holds other token ids
    with pytest.raises(CacheIncomplete, match=r"3 of 4 prepared rows whole: 1 missing \(rows 1\)"):
        keep(tmp_path, target, prepared, cache)


def test_an_extraction_already_there_is_never_overwritten(tmp_path, target, prepared):
    cache = tmp_path / "run" / "hidden_states_cache"
    cache.mkdir(parents=True)
    for i, ids in enumerate(ROWS):
        write_sample(cache, i, ids)
    (tmp_path / "run" / "extraction").mkdir()
    (tmp_path / "run" / "extraction" / "data_config.json").write_text("{}")
    with pytest.raises(InputError, match="holds files already"):
        keep(tmp_path, target, prepared, cache)
    assert (tmp_path / "run" / "extraction" / "data_config.json").read_text() == "{}"
