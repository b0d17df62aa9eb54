"""vLLM itself (its CPU build, `make vllm`) extracting in two shards: merged, the folder is what one vLLM
extraction of the same rows writes, every sample byte for byte (header included: the connector's metadata
stamp comes out of safetensors in a random key order, which workers.stages.extract.output.stable_header sorts) and
the manifest but for its timings. Two rows, the shortest prepared; three `vllm serve` starts (one for the
whole, one per shard) are most of its time. Where vLLM is not installed this skips, saying so (CI sets
EAGLE3WEB_REQUIRE_VLLM=1, so there it fails instead)."""
from __future__ import annotations

import json

import pytest
from tests.helpers.vllm_here import vllm_or_skip

from workers.contract.target import default_layer_ids, read_target_config
from workers.stages.extract.shards import extract_merge
from workers.stages.extract.batch_plan import open_prepared
from workers.stages.extract.with_vllm import LOG_NAME, extract_with_vllm
from workers.stages.prepare.stage import prepare
from workers.stages.shards import shard_dir, spans_split

pytestmark = [pytest.mark.slow]

CONVERSATIONS = 2
MAX_SEQ_LEN = 48
MEASURED = {"total_time_seconds", "model_load_seconds", "forward_seconds", "tokens_per_second", "created_at",
            "time_split_s"}


def test_a_vllm_extraction_in_two_shards_equals_one_vllm_extraction(tiny_target, tmp_path):
    install = vllm_or_skip()
    lines = tiny_target.chats_path.read_text().splitlines()[:CONVERSATIONS]
    (tmp_path / "chats.jsonl").write_text("\n".join(lines) + "\n")
    prepared = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=tmp_path / "chats.jsonl",
                       out_dir=tmp_path / "prepared", max_seq_len=MAX_SEQ_LEN)
    assert prepared.num_rows >= 2
    common = dict(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                  layer_ids=default_layer_ids(tiny_target.num_layers), vllm_executable=install.executable)
    one = extract_with_vllm(out_dir=tmp_path / "one" / "extraction", **common)
    out = tmp_path / "sharded" / "extraction"
    spans = spans_split(prepared.num_rows, 2)
    shards = [extract_with_vllm(out_dir=shard_dir(out, i), rows=span, **common) for i, span in enumerate(spans)]
    assert [s.num_samples for s in shards] == [len(s) for s in spans]
    _, lengths = open_prepared(prepared.out_dir)
    extract_merge(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=out,
                  layer_ids=common["layer_ids"], hidden_size=read_target_config(tiny_target.target_dir).hidden_size,
                  lengths=lengths, dtype="bfloat16", shards=[s.as_dict() for s in shards], tp_size=1,
                  extra={"extraction_backend": "vllm"})

    def tree(root):  # vLLM's own server log is not part of the extraction (its words differ run to run)
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != LOG_NAME}

    assert tree(out) == tree(one.out_dir) and len([n for n in tree(out) if n.startswith("hidden_states/")]) == len(lengths)
    for name in sorted(tree(out) - {"data_config.json"}):
        assert (out / name).read_bytes() == (one.out_dir / name).read_bytes(), name
    a, b = (json.loads((root / "data_config.json").read_text()) for root in (out, one.out_dir))
    assert {k: v for k, v in a.items() if k not in MEASURED} == {k: v for k, v in b.items() if k not in MEASURED}
