"""A preparation split into shards (issue 36) writes, once merged, the very files one worker's prepare()
writes: the arrow rows, state.json, dataset_info.json and token_freq.pt byte for byte, and the same
counts, length histogram and summary. Data shaped like users': many turns in both chat formats, odd
unicode, blank lines, a row without an id, the same conversation again under new ids, rows curation
excluded (by id, by content, by own id), rows truncated at max_seq_len, and write batches smaller than
a shard so the merge's batches cross the parts' seams."""
from __future__ import annotations

import copy
import filecmp
import json
from dataclasses import asdict

import pytest

from tests.helpers.long_chats import long_chat_rows
from workers.contract.chats.jsonl import parse_row
from workers.stages.prepare import stage as prepare_module
from workers.stages.prepare.stage import prepare
from workers.stages.prepare.merge import PrepareMergeError, prepare_count_rows, prepare_merge, prepare_shard
from workers.stages.shards import shard_dir, spans_split

MAX_SEQ_LEN = 384  # the long chats run to hundreds of tokens a row: several are truncated here
FILES = ("data-00000-of-00001.arrow", "state.json", "dataset_info.json", "token_freq.pt")


def _user_rows() -> list[str]:
    rows = long_chat_rows(10, seed=3, turns=(2, 5))
    again = []
    for i in (1, 4):  # the same conversation again under a new id: a new row, rendered the same
        twin = copy.deepcopy(rows[i])
        twin["id"] = f"again-{i}"
        again.append(twin)
    no_id = {"conversations": [{"from": "human", "value": "Ωμέγα ∑ x² ≤ ∞ — naïve café? 👩‍💻"},
                               {"from": "gpt", "value": "東京タワー 🇯🇵"}]}
    only_user = {"id": "no-reply", "messages": [{"role": "user", "content": "hello"}]}
    lines = [json.dumps(r, ensure_ascii=False) for r in rows[:7] + again + [no_id, only_user] + rows[7:]]
    lines.insert(5, "")  # a blank line is no conversation, and does not shift the shards' numbering
    return lines


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("prep-shards") / "chats.jsonl"
    path.write_text("\n".join(_user_rows()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def exclusions(source):
    """One row excluded by id, one id-less row by content hash, one by its own id."""
    lines = [line for line in source.read_text(encoding="utf-8").splitlines()]
    no_id_line = next(i for i, line in enumerate(lines) if line.startswith('{"conversations": [{"from": "human", "value": "Ωμέγα'))
    conv = parse_row(lines[no_id_line], path=source, line=no_id_line + 1)
    return dict(exclude_ids=frozenset({"1003"}), exclude_hashes=frozenset({conv.content_hash}),
                exclude_own_ids=frozenset({"again-4"}))


def _one_and_sharded(tiny_target, source, tmp_path, shards: int, **options):
    common = dict(tokenizer_dir=tiny_target.target_dir, dataset_path=source, max_seq_len=MAX_SEQ_LEN, **options)
    one = prepare(out_dir=tmp_path / "one", **common)
    total = prepare_count_rows(source)
    spans = spans_split(total, shards)
    parts = []
    for index in reversed(range(len(spans))):  # the shards run in any order, on any worker
        parts.append(prepare_shard(out_dir=shard_dir(tmp_path / "stage", index), rows=spans[index], **common))
    merged = prepare_merge(part_dirs=[shard_dir(tmp_path / "stage", i) for i in range(len(spans))],
                           out_dir=tmp_path / "merged", total_rows=total,
                           **{k: v for k, v in common.items() if k in ("dataset_path", "max_seq_len")},
                           max_samples=options.get("max_samples"))
    return one, merged, parts


def _same_files_and_counts(one, merged) -> None:
    for name in FILES:
        assert filecmp.cmp(one.out_dir / name, merged.out_dir / name, shallow=False), name
    ours = {k: v for k, v in asdict(one).items() if k not in ("out_dir", "token_freq_path")}
    theirs = {k: v for k, v in asdict(merged).items() if k not in ("out_dir", "token_freq_path")}
    assert theirs == ours
    summary = json.loads((merged.out_dir / "prepare_summary.json").read_text())
    assert summary["length_histogram"] == one.length_histogram and summary["out_dir"] == str(merged.out_dir)


def test_three_shards_merge_into_one_workers_files(tiny_target, source, exclusions, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "WRITE_CHUNK_ROWS", 7)  # batches that cross the parts' seams
    one, merged, parts = _one_and_sharded(tiny_target, source, tmp_path, 3, **exclusions)
    _same_files_and_counts(one, merged)
    # The data did what it is here for: exclusions of each kind, truncations, a conversation with no reply.
    assert one.num_excluded == 3 and one.num_truncated_rows > 5 and one.num_without_assistant >= 1
    assert one.num_rows > 2 * 7 and sum(p.training_rows for p in parts) == one.num_rows
    assert prepare_count_rows(source) == one.num_conversations + one.num_excluded == 14


def test_max_samples_cuts_where_one_worker_stops_reading(tiny_target, source, tmp_path):
    """The cap falls inside the second of four shards: the merge drops the rest, counting what one
    worker counted before it stopped."""
    one, merged, parts = _one_and_sharded(tiny_target, source, tmp_path, 4, max_samples=12)
    _same_files_and_counts(one, merged)
    assert one.num_rows == 12 and one.num_conversations < prepare_count_rows(source)


def test_a_missing_or_misplaced_part_is_refused_naming_it(tiny_target, source, tmp_path):
    common = dict(tokenizer_dir=tiny_target.target_dir, dataset_path=source, max_seq_len=MAX_SEQ_LEN)
    spans = spans_split(prepare_count_rows(source), 2)
    prepare_shard(out_dir=shard_dir(tmp_path, 1), rows=spans[1], **common)
    merge = dict(dataset_path=source, max_seq_len=MAX_SEQ_LEN, out_dir=tmp_path / "merged")
    with pytest.raises(PrepareMergeError, match=r"00000: a shard's part is missing"):
        prepare_merge(part_dirs=[shard_dir(tmp_path, 0), shard_dir(tmp_path, 1)], **merge)
    with pytest.raises(PrepareMergeError, match=r"but the parts before it end at 0"):
        prepare_merge(part_dirs=[shard_dir(tmp_path, 1)], **merge)
    prepare_shard(out_dir=shard_dir(tmp_path, 0), rows=spans[0], **common)
    with pytest.raises(PrepareMergeError, match=r"cover conversations 0\.\.14, not the 15"):
        prepare_merge(part_dirs=[shard_dir(tmp_path, 0), shard_dir(tmp_path, 1)], total_rows=15, **merge)
    assert not (tmp_path / "merged").exists()
