"""A sharded preparation (issue 36): each shard renders its span of conversations into a part, and the
merge writes the prepared dataset from the parts exactly as one worker writes it from the file.

A shard's rows are conversations (non-blank lines of the chat file) numbered 0.. in file order. A part
keeps, per conversation, what prepare's loop needs (workers.stages.prepare.render.Outcome: excluded or not,
its rows with their truncation, the turns it lost), so the merge feeds the very same loop
(prepared_write): the same max_samples cut, the same write batches, the same counts, histogram and
token frequencies, and the same bytes. A part's folder appears whole (written aside, then renamed),
and part.json, written last inside it, says which rows it holds and with which settings.

max_samples counts rows after the per-turn fan-out, which no shard knows of the shards before it: each
shard stops once its own rows reach it (those before it can only add), and the merge cuts where one
worker would have stopped reading.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from workers.contract.chats.jsonl import read_conversations
from workers.contract.errors import InputError
from workers.contract.progress import ProgressFn
from workers.stages.prepare.stage import PrepareResult, _checked, _features, prepared_write
from workers.stages.prepare.render import ChatRenderer, Outcome, Row, load_tokenizer, outcome_of

PART_ARROW, PART_OUTCOMES, PART_META = "part.arrow", "outcomes.jsonl", "part.json"


class PrepareMergeError(InputError):
    """The parts cannot be put together: one is missing, or they do not follow each other."""


@dataclass(frozen=True)
class PreparePart:
    out_dir: Path
    rows: tuple[int, int]  # [start, stop) of the conversations
    conversations: int  # read by this shard (fewer than its span where max_samples stopped it)
    training_rows: int

    def as_dict(self) -> dict:
        """JSON-able (a shard row's result)."""
        d = asdict(self)
        d["out_dir"] = str(d["out_dir"])
        d["rows"] = list(self.rows)
        return d


def prepare_count_rows(dataset_path: Path) -> int:
    """The conversations of a chat file, which a preparation's shards number: read (and checked, line by
    line) once before the split, so a bad line is refused before any shard is sent."""
    return sum(1 for _ in read_conversations(Path(dataset_path)))


def prepare_shard(*, tokenizer_dir: Path, dataset_path: Path, out_dir: Path, max_seq_len: int,
                  max_samples: int | None = None, exclude_ids: frozenset[str] = frozenset(),
                  exclude_hashes: frozenset[str] = frozenset(), exclude_own_ids: frozenset[str] = frozenset(),
                  on_progress: ProgressFn | None = None, rows: range) -> PreparePart:
    """One shard's part of prepare() (issue 36): only conversations `rows` (numbered 0.. in file order, as
    prepare_count_rows counts them) are rendered, into out_dir (the shard's folder), as a part that
    prepare_merge puts together with the others. Here, not in prepare.py, so that the imports go one way."""
    dataset_path, out_dir = _checked(dataset_path, out_dir, max_seq_len, max_samples)
    renderer = ChatRenderer(load_tokenizer(Path(tokenizer_dir)))
    exclusions = dict(ids=exclude_ids, hashes=exclude_hashes, own_ids=exclude_own_ids)
    return prepare_part(renderer=renderer, dataset_path=dataset_path, out_dir=out_dir, max_seq_len=max_seq_len,
                        max_samples=max_samples, exclusions=exclusions, rows=rows, on_progress=on_progress)


def prepare_part(*, renderer: ChatRenderer, dataset_path: Path, out_dir: Path, max_seq_len: int,
                 max_samples: int | None, exclusions: dict, rows: range, on_progress: ProgressFn | None) -> PreparePart:
    """prepare_shard's work: render conversations rows.start..rows.stop into the part in out_dir."""
    from datasets.arrow_writer import ArrowWriter

    if rows.step != 1 or rows.start < 0 or rows.start >= rows.stop:
        raise ValueError(f"rows must be a non-empty span of conversations, got {rows}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    conversations = written = 0
    try:
        with ArrowWriter(features=_features(), path=str(staging / PART_ARROW)) as writer, \
                open(staging / PART_OUTCOMES, "w", encoding="utf-8") as outcomes:
            for index, conv in enumerate(read_conversations(dataset_path)):
                if index < rows.start:
                    continue
                if index >= rows.stop or (max_samples is not None and written >= max_samples):
                    break
                outcome = outcome_of(conv, renderer=renderer, max_seq_len=max_seq_len, **exclusions)
                outcomes.write(json.dumps([outcome.source_id, outcome.excluded, outcome.dropped,
                                           [[r.truncated, r.truncated_loss_tokens] for r in outcome.rows]],
                                          ensure_ascii=False) + "\n")
                if outcome.rows:
                    writer.write_batch({"input_ids": [r.input_ids for r in outcome.rows],
                                        "loss_mask": [r.loss_mask for r in outcome.rows],
                                        "seq_len": [len(r.input_ids) for r in outcome.rows],
                                        "source_id": [outcome.source_id] * len(outcome.rows)})
                conversations += 1
                written += len(outcome.rows)
                if on_progress is not None:
                    on_progress(conversations, len(rows))
            writer.finalize()
        if conversations == 0:
            raise PrepareMergeError(f"{dataset_path} has no conversation {rows.start}: was it changed after the split?")
        (staging / PART_META).write_text(json.dumps({
            "rows": [rows.start, rows.stop], "conversations": conversations, "training_rows": written,
            "max_seq_len": max_seq_len, "max_samples": max_samples}) + "\n")
        if out_dir.exists():
            out_dir.rmdir()  # _checked: absent or empty
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if on_progress is not None:
        on_progress(len(rows), len(rows))
    return PreparePart(out_dir=out_dir, rows=(rows.start, rows.stop), conversations=conversations,
                       training_rows=written)


def _part_meta(part_dir: Path) -> dict:
    try:
        return json.loads((part_dir / PART_META).read_text())
    except (OSError, ValueError):
        raise PrepareMergeError(f"{part_dir}: a shard's part is missing or unfinished; retry the shards that "
                                "did not finish") from None


def _outcomes(part_dirs: list[Path]) -> Iterator[Outcome]:
    """Every part's conversations in order, with their rows read back from the part's arrow file."""
    from datasets import Dataset

    for part_dir in part_dirs:
        table = Dataset.from_file(str(part_dir / PART_ARROW)).with_format(None)
        batches = table.iter(batch_size=512)
        batch, at = {"input_ids": []}, 0
        with open(part_dir / PART_OUTCOMES, encoding="utf-8") as fh:
            for line in fh:
                source_id, excluded, dropped, flags = json.loads(line)
                rows = []
                for truncated, cut in flags:
                    if at == len(batch["input_ids"]):
                        batch, at = next(batches), 0
                    rows.append(Row(batch["input_ids"][at], batch["loss_mask"][at], truncated, cut))
                    at += 1
                yield Outcome(source_id, excluded, rows, dropped)
        del table


def prepare_merge(*, part_dirs: list[Path], dataset_path: Path, out_dir: Path, max_seq_len: int,
                  max_samples: int | None = None, total_rows: int | None = None) -> PrepareResult:
    """The prepared dataset in out_dir from the shards' parts (in shard order), and prepare's result:
    the files and counts one worker's prepare() writes over the whole file. `total_rows`, when given,
    is checked against the conversations the parts' spans cover."""
    dataset_path, out_dir = _checked(dataset_path, out_dir, max_seq_len, max_samples)
    part_dirs = [Path(p) for p in part_dirs]
    if not part_dirs:
        raise PrepareMergeError("no shards to merge")
    expected = 0
    for part_dir in part_dirs:
        meta = _part_meta(part_dir)
        if meta["rows"][0] != expected:
            raise PrepareMergeError(f"{part_dir} holds conversations {meta['rows'][0]}..{meta['rows'][1]}, but the "
                                    f"parts before it end at {expected}: the parts do not follow each other")
        if (meta["max_seq_len"], meta["max_samples"]) != (max_seq_len, max_samples):
            raise PrepareMergeError(f"{part_dir} was prepared with max_seq_len={meta['max_seq_len']}, max_samples="
                                    f"{meta['max_samples']}, not {max_seq_len}, {max_samples}; retry the preparation")
        expected = meta["rows"][1]
    if total_rows is not None and expected != total_rows:
        raise PrepareMergeError(f"the parts cover conversations 0..{expected}, not the {total_rows} of {dataset_path}")
    return prepared_write(_outcomes(part_dirs), dataset_path=dataset_path, out_dir=out_dir, max_seq_len=max_seq_len,
                          max_samples=max_samples)
