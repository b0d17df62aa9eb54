"""A regeneration split into shards (issue 36), transformers backend: the merged output file, its
failures file and the counts are byte for byte / field for field one worker's, with sampled replies
(each reply's seed is its row's, never its place in a shard), rows of every shape, the same prompt
again under new ids, a repeated id, a prompt too long for the target, curation's exclusions,
max_samples and replies cut at max_new_tokens. vLLM: tests/stages/regenerate/test_regenerate_shards_vllm.py."""
from __future__ import annotations

import copy
import filecmp
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.helpers.regenerate_data import TOO_LONG_TEXT, demo_rows, read_jsonl, shaped_rows, talking_target, write_jsonl
from workers.stages.regenerate.base import RegenerateError, RegenerateSettings
from workers.stages.regenerate.stage import regenerate, regenerate_count_rows
from workers.stages.regenerate.merge import regenerate_merge
from workers.stages.shards import shard_dir, spans_split

SAMPLED = RegenerateSettings(max_new_tokens=12, temperature=0.9, seed=5)  # 12 tokens: many replies are cut
EXCLUDED = dict(exclude_ids=frozenset({"oa-two-users"}), exclude_own_ids=frozenset({"again-2"}))
TIMING = ("seconds", "tokens_per_s", "out_path", "failures_path")


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    return talking_target(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def source(talker, tmp_path_factory):
    rows = shaped_rows() + demo_rows(talker.chats_path, 8)
    again = []
    for n, i in enumerate((0, 3, 9)):  # the same conversation under new ids: sampled with their own seeds
        twin = copy.deepcopy(rows[i])
        twin["id"] = f"again-{n}"
        again.append(twin)
    repeated_id = copy.deepcopy(rows[10])  # an id a row above has: failed on its own line, as one worker does
    too_long = {"id": "too-long", "messages": [{"role": "user", "content": TOO_LONG_TEXT}]}
    return write_jsonl(tmp_path_factory.mktemp("regen-shards") / "chats.jsonl",
                       rows[:6] + again[:2] + [too_long] + rows[6:11] + [repeated_id] + again[2:] + rows[11:])


@pytest.fixture(scope="module")
def one_worker(talker, source, tmp_path_factory):
    out = tmp_path_factory.mktemp("regen-one") / "out.jsonl"
    return regenerate(target_dir=talker.target_dir, source_path=source, out_path=out, backend="transformers",
                      settings=SAMPLED, device="cpu", **EXCLUDED)


def _shards(talker, source, stage_dir: Path, shards: int, settings=SAMPLED, order=None):
    total = regenerate_count_rows(source_path=source, settings=settings, **EXCLUDED)
    spans = spans_split(total, shards)
    parts = {}
    for index in order or range(len(spans)):
        parts[index] = regenerate(target_dir=talker.target_dir, source_path=source, backend="transformers",
                                  out_path=shard_dir(stage_dir, index) / "out.jsonl", settings=settings,
                                  device="cpu", rows=spans[index], **EXCLUDED)
    return [parts[i] for i in range(len(spans))], total


def _fields(result) -> dict:
    return {k: v for k, v in asdict(result).items() if k not in TIMING}


def test_three_shards_in_any_order_merge_into_one_workers_file(talker, source, one_worker, tmp_path):
    parts, total = _shards(talker, source, tmp_path / "stage", 3, order=[2, 0, 1])
    merged = regenerate_merge(parts=parts, out_path=tmp_path / "out.jsonl")
    assert Path(one_worker.out_path).read_bytes() == (tmp_path / "out.jsonl").read_bytes()
    assert filecmp.cmp(one_worker.failures_path, merged.failures_path, shallow=False)
    assert filecmp.cmp(one_worker.out_path + ".meta.json", str(tmp_path / "out.jsonl.meta.json"), shallow=False)
    assert _fields(merged) == _fields(one_worker)
    # The file did what it is here for: two failures (too long, repeated id), two exclusions, cut replies,
    # twins whose sampled replies differ from their originals' (their own seeds).
    assert (one_worker.failures, one_worker.skipped_excluded) == (2, 2) and one_worker.replies_cut >= 1
    assert total == one_worker.conversations + one_worker.failures
    written = {r["id"]: r for r in read_jsonl(one_worker.out_path)}
    assert written["again-0"]["messages"] != written["oa-sys"]["messages"]
    assert [p.conversations + p.failures for p in parts] == [len(s) for s in spans_split(total, 3)]


def test_max_samples_and_a_shard_that_answers_none_of_its_rows(talker, source, tmp_path):
    """max_samples chooses over the whole file; the last of 7 shards holds only the too-long row: it
    fails its one conversation without failing the shard, and the merge counts it once."""
    settings = RegenerateSettings(max_new_tokens=6, temperature=0.9, seed=5, max_samples=8)
    one = regenerate(target_dir=talker.target_dir, source_path=source, out_path=tmp_path / "one.jsonl",
                     backend="transformers", settings=settings, device="cpu", **EXCLUDED)
    parts, total = _shards(talker, source, tmp_path / "stage", 7, settings=settings)
    assert total == 8 and parts[-1].conversations == 0 and parts[-1].failures == 1
    merged = regenerate_merge(parts=parts, out_path=tmp_path / "merged.jsonl")
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "merged.jsonl").read_bytes()
    assert _fields(merged) | {"out_path": 0} == _fields(one) | {"out_path": 0}


def test_a_missing_part_or_a_span_past_the_end_is_refused(talker, source, one_worker, tmp_path):
    total = regenerate_count_rows(source_path=source, settings=SAMPLED, **EXCLUDED)
    with pytest.raises(RegenerateError, match=rf"rows {total - 1}\.\.{total + 1} is not a span of the {total}"):
        regenerate(target_dir=talker.target_dir, source_path=source, out_path=tmp_path / "p.jsonl",
                   backend="transformers", settings=SAMPLED, device="cpu", rows=range(total - 1, total + 1), **EXCLUDED)
    gone = asdict(one_worker) | {"out_path": str(tmp_path / "gone.jsonl")}
    with pytest.raises(RegenerateError, match=r"gone\.jsonl: a shard's part is not there"):
        regenerate_merge(parts=[one_worker, gone], out_path=tmp_path / "merged.jsonl")
    assert not (tmp_path / "merged.jsonl").exists()
