"""An extraction split into shards writes, once merged, exactly the extraction one worker writes: every
sample file byte for byte, the same resume record, and one manifest that differs only in what is measured
(timings, the time it was written). With the CPU's default batch budget, so that rows share forwards and
the shards must run the very batches one worker runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.contract.target import default_layer_ids, read_target_config
from workers.stages.extract.shards import WRITE_TOKENS_PER_ROW, batch_spans, batch_work, extract_merge
from workers.stages.extract.batch_plan import DEFAULT_BATCH_TOKENS, open_prepared, plan_forward_batches
from workers.stages.extract.with_transformers import extract
from workers.stages.prepare.stage import prepare
from workers.stages.shards import shard_dir

CONVERSATIONS = 40
# What differs between any two extractions of the same rows, one worker or many: when and how fast.
MEASURED = {"total_time_seconds", "model_load_seconds", "forward_seconds", "tokens_per_second", "created_at",
            "time_split_s"}


@pytest.fixture(scope="module")
def prepared(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("extract-shards")
    lines = tiny_target.chats_path.read_text().splitlines()[:CONVERSATIONS]
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    return prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=root / "chats.jsonl",
                   out_dir=root / "prepared", max_seq_len=128)


@pytest.fixture(scope="module")
def one_worker(tiny_target, prepared, tmp_path_factory):
    return extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                   out_dir=tmp_path_factory.mktemp("one") / "extraction",
                   layer_ids=default_layer_ids(tiny_target.num_layers), device="cpu")


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_batch_spans_begin_where_batches_begin_and_cover_every_row():
    batches = [[5, 1, 2], [0, 4], [3], [6, 7, 8, 9]]  # 10 rows in the order one worker runs them
    assert batch_spans(batches, 2) == [range(0, 5), range(5, 10)]
    assert batch_spans(batches, 3) == [range(0, 3), range(3, 6), range(6, 10)]
    assert batch_spans(batches, 10) == [range(0, 3), range(3, 5), range(5, 6), range(6, 10)]  # one per batch at most
    assert batch_spans([[0, 1, 2, 3]], 2) == [range(0, 4)]


def test_batch_spans_with_work_split_the_work_not_the_rows():
    """The longest rows come first: halving the rows gave the first of two shards about twice the second's
    forwards (15.7 s against 9.2 s, 1,600 demo rows). Weighted by padded tokens, the edges move."""
    batches = [[5, 1, 2], [0, 4], [3], [6, 7, 8, 9]]
    assert batch_spans(batches, 2, [30, 10, 5, 8]) == [range(0, 3), range(3, 10)]  # 30 | 23, not 5 rows | 5
    assert batch_spans(batches, 3, [30, 10, 5, 8]) == [range(0, 3), range(3, 5), range(5, 10)]
    lengths = [9, 8, 8, 3, 9, 8, 2, 2, 2, 1]  # rows 0, 4, 1, 2, 5 long; 3, 6-9 short
    # With a hidden size of 10, a row of 11 tokens costs twice its padded tokens (attention), plus its file.
    assert batch_work(batches, lengths, hidden_size=10) == pytest.approx([
        3 * (8 * (1 + 8 / 11) + WRITE_TOKENS_PER_ROW), 2 * (9 * (1 + 9 / 11) + WRITE_TOKENS_PER_ROW),
        1 * (3 * (1 + 3 / 11) + WRITE_TOKENS_PER_ROW), 4 * (2 * (1 + 2 / 11) + WRITE_TOKENS_PER_ROW)])
    with pytest.raises(ValueError, match="3 weights for 4 batches"):
        batch_spans(batches, 2, [1, 2, 3])


def test_two_shards_merged_are_byte_identical_to_one_worker(tiny_target, prepared, one_worker, tmp_path):
    layer_ids = default_layer_ids(tiny_target.num_layers)
    _, lengths = open_prepared(prepared.out_dir)
    plan = plan_forward_batches(lengths, DEFAULT_BATCH_TOKENS["cpu"])
    spans = batch_spans(plan, 2)
    assert len(plan) >= 3 and len(spans) == 2  # rows share forwards, and each shard runs more than one
    out = tmp_path / "extraction"
    shards = [extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=shard_dir(out, i),
                      layer_ids=layer_ids, device="cpu", rows=span) for i, span in enumerate(spans)]
    assert [s.num_samples for s in shards] == [len(s) for s in spans]
    assert sum(s.tokens_extracted for s in shards) == one_worker.total_tokens
    merged = extract_merge(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=out,
                           layer_ids=layer_ids, hidden_size=read_target_config(tiny_target.target_dir).hidden_size,
                           lengths=lengths, dtype="bfloat16", shards=[s.as_dict() for s in shards])
    mine, theirs = tree(out), tree(one_worker.out_dir)
    assert sorted(mine) == sorted(theirs)  # no shard folder left, nothing missing
    samples = [name for name in mine if name.startswith("hidden_states/")]
    assert len(samples) == prepared.num_rows
    for name in samples + ["resume.json"]:
        assert mine[name] == theirs[name], name
    a, b = json.loads(mine["data_config.json"]), json.loads(theirs["data_config.json"])
    assert {k: v for k, v in a.items() if k not in MEASURED} == {k: v for k, v in b.items() if k not in MEASURED}
    assert merged.num_samples == prepared.num_rows and merged.bytes_on_disk == one_worker.bytes_on_disk
    assert "merge" in merged.time_split_s


def test_a_shard_refuses_rows_outside_the_prepared_rows(tiny_target, prepared, tmp_path):
    with pytest.raises(ValueError, match="not a span"):
        extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir, out_dir=tmp_path / "s",
                layer_ids=default_layer_ids(tiny_target.num_layers), device="cpu",
                rows=range(0, prepared.num_rows + 1))


# What a worker's pool process does to plan a split extraction, in a fresh Python: its start-up probe (in a
# child, as workers.orchestration.fleet does), then the extraction's spans for 2 shards.
PLAN_IN_A_FRESH_PROCESS = """
import json, sys, types
import django
django.setup()
from workers.orchestration import fleet
from workers.contract.host.backends import host_capabilities_isolated
from workers.orchestration.shard_runners import SHARDABLE
fleet._node.update(capabilities=host_capabilities_isolated())
run = types.SimpleNamespace(config={}, preparation=types.SimpleNamespace(out_dir=sys.argv[1], num_rows=int(sys.argv[2])),
                            target=types.SimpleNamespace(path=sys.argv[3]))
spans = SHARDABLE["extract"].spans_for(types.SimpleNamespace(run=run), 2)
print(json.dumps({"spans": [[s.start, s.stop] for s in spans],
                  "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_planning_a_split_imports_neither_torch_nor_transformers(tiny_target, prepared):
    """The planning worker finds the forward batches' edges without torch (it cost a fresh pool process
    3.6-7.1 s), and finds the very edges the shards' batches have on this (CPU) host, even in work."""
    env = {**{k: v for k, v in os.environ.items() if k != "EAGLE3WEB_EXTRACT_BATCH_TOKENS"},
           "DJANGO_SETTINGS_MODULE": "eagle3web.settings", "OMP_NUM_THREADS": "1",
           "EAGLE3WEB_DATA_ROOTS": str(Path(tiny_target.target_dir).resolve().parent)}
    proc = subprocess.run([sys.executable, "-c", PLAN_IN_A_FRESH_PROCESS, str(prepared.out_dir), str(prepared.num_rows),
                           str(tiny_target.target_dir)],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[3], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = json.loads(proc.stdout.strip().splitlines()[-1])
    assert planned["imported"] == []
    _, lengths = open_prepared(prepared.out_dir)
    batches = plan_forward_batches(lengths, DEFAULT_BATCH_TOKENS["cpu"])
    hidden = read_target_config(tiny_target.target_dir).hidden_size
    expected = batch_spans(batches, 2, batch_work(batches, lengths, hidden))
    assert planned["spans"] == [[s.start, s.stop] for s in expected] and len(expected) == 2
