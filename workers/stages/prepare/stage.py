"""Prepare stage: a JSONL chat file -> speculators 0.9 prepared dataset + token_freq.pt.

Each conversation is rendered into rows with upstream's loss mask by workers.stages.prepare.render (its
docstring says how, line by line against speculators 0.9 `data_generation/preprocessing.py`); this module
reads the file, counts, and writes as upstream writes:
- `build_speculator_training_dataset` ends with `set_format("torch")`, which `save_to_disk`
  records in state.json; `speculators.train.data.ArrowDataset` relies on it (`torch.equal`
  against the row's input_ids), so we save the same way.
- `train/vocab_mapping.py:save_token_frequency_distribution`: `torch.save` of a plain
  dict[int, int] counted over loss-masked tokens of the final rows.
Where we differ on purpose: a row with an unknown role or non-text content is refused with its
line (upstream maps unknown roles to assistant), and rows of both `conversations` and
`messages` files are read (upstream's prepare-data reads only `conversations`).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from workers.contract.chats.jsonl import DatasetFormatError, read_conversations  # noqa: E402
from workers.contract.progress import ProgressFn  # noqa: E402
# What prepare renders with.
from workers.stages.prepare.render import MASK_SOURCE, ChatRenderer, load_tokenizer, outcome_of  # noqa: E402

log = logging.getLogger(__name__)


HISTOGRAM_BINS = 20
WRITE_CHUNK_ROWS = 512


@dataclass(frozen=True)
class PrepareResult:
    out_dir: Path
    token_freq_path: Path
    num_conversations: int  # read and not excluded
    num_rows: int
    num_skipped: int  # num_excluded + num_without_assistant
    num_excluded: int
    num_without_assistant: int  # conversations that produced no supervised row
    num_turns_dropped: int  # assistant turns lost to max_seq_len or an unstable template
    num_truncated_rows: int  # rows clipped at max_seq_len (reply may be cut mid-way)
    truncated_loss_tokens: int  # supervised tokens beyond max_seq_len in those rows, cut off
    total_tokens: int
    loss_tokens: int
    max_seq_len: int
    mask_source: str  # MASK_SOURCE; earlier runs may have recorded "generation_tags"
    length_histogram: dict

    def as_dict(self) -> dict:
        d = asdict(self)
        d["out_dir"], d["token_freq_path"] = str(self.out_dir), str(self.token_freq_path)
        return d


def length_histogram(lengths: list[int], max_seq_len: int, bins: int = HISTOGRAM_BINS) -> dict:
    """Integer-edged histogram over [0, max_seq_len]; the last bin includes max_seq_len."""
    edges = np.unique(np.linspace(0, max_seq_len, min(bins, max_seq_len) + 1).round().astype(int))
    counts, _ = np.histogram(np.asarray(lengths, dtype=np.int64), bins=edges)
    return {"edges": [int(e) for e in edges], "counts": [int(c) for c in counts]}


def _features():
    from datasets import Features, Sequence, Value

    return Features(
        {
            "input_ids": Sequence(Value("int64")),
            "loss_mask": Sequence(Value("int64")),
            "seq_len": Value("int64"),
            "source_id": Value("string"),
        }
    )


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def _checked(dataset_path: Path, out_dir: Path, max_seq_len: int, max_samples: int | None) -> tuple[Path, Path]:
    dataset_path, out_dir = Path(dataset_path), Path(out_dir)
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be at least 2, got {max_seq_len}")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be positive, got {max_samples}")
    if not dataset_path.is_file():
        raise FileNotFoundError(f"{dataset_path}: dataset file not found")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir}: output directory is not empty; choose a new one")
    return dataset_path, out_dir


def prepare(
    *,
    tokenizer_dir: Path,
    dataset_path: Path,
    out_dir: Path,
    max_seq_len: int,
    max_samples: int | None = None,
    exclude_ids: frozenset[str] = frozenset(),
    exclude_hashes: frozenset[str] = frozenset(),
    exclude_own_ids: frozenset[str] = frozenset(),
    on_progress: ProgressFn | None = None,
):
    """Tokenize a chat JSONL into speculators' prepared layout under out_dir.

    max_samples caps the number of rows (speculators' meaning: rows after per-turn fan-out);
    reading stops once it is reached. out_dir must be absent or empty; it is filled atomically.
    Curation's exclusions (see `_excluded`): `exclude_ids` skip any row by id (samples catalogued
    before content hashes were kept), `exclude_hashes` skip rows without an "id" by content,
    `exclude_own_ids` skip rows carrying that "id" of their own.

    One shard's part of a preparation (issue 36) is workers.stages.prepare.merge.prepare_shard's.
    """
    dataset_path, out_dir = _checked(dataset_path, out_dir, max_seq_len, max_samples)
    renderer = ChatRenderer(load_tokenizer(Path(tokenizer_dir)))
    exclusions = dict(ids=exclude_ids, hashes=exclude_hashes, own_ids=exclude_own_ids)
    total_lines = _count_lines(dataset_path)
    report = _Throttle(on_progress, total_lines)

    def outcomes():
        for conv in read_conversations(dataset_path):
            report(conv.line)
            yield outcome_of(conv, renderer=renderer, max_seq_len=max_seq_len, **exclusions)

    result = prepared_write(outcomes(), dataset_path=dataset_path, out_dir=out_dir, max_seq_len=max_seq_len,
                            max_samples=max_samples)
    report(total_lines, force=True)
    return result


def prepared_write(outcomes, *, dataset_path: Path, out_dir: Path, max_seq_len: int,
                   max_samples: int | None) -> PrepareResult:
    """The prepared dataset, token frequencies and summary from the conversations' outcomes in file
    order: one worker's rendering, or a sharded preparation's parts read back (prepare_merge), so both
    write the same bytes (the same rows, in the same write batches)."""
    from datasets.arrow_writer import ArrowWriter

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    stats = Counter()
    token_freq: Counter[int] = Counter()
    lengths: list[int] = []
    try:
        arrow_path = staging / "rows.arrow"
        with ArrowWriter(features=_features(), path=str(arrow_path)) as writer:
            chunk = {"input_ids": [], "loss_mask": [], "seq_len": [], "source_id": []}
            for outcome in outcomes:
                if outcome.excluded:
                    stats["excluded"] += 1
                    continue
                stats["conversations"] += 1
                rows, dropped = outcome.rows, outcome.dropped
                stats["turns_dropped"] += dropped
                if max_samples is not None:
                    rows = rows[: max_samples - stats["rows"]]
                if not rows:
                    stats["without_assistant"] += 1
                for ids, mask, truncated, cut_loss in rows:
                    stats["truncated"] += truncated
                    stats["truncated_loss_tokens"] += cut_loss
                    ids_t = torch.tensor(ids, dtype=torch.long)
                    token_freq.update(ids_t[torch.tensor(mask, dtype=torch.bool)].tolist())
                    chunk["input_ids"].append(ids)
                    chunk["loss_mask"].append(mask)
                    chunk["seq_len"].append(len(ids))
                    chunk["source_id"].append(outcome.source_id)
                    lengths.append(len(ids))
                    stats["rows"] += 1
                    stats["loss_tokens"] += sum(mask)
                if len(chunk["seq_len"]) >= WRITE_CHUNK_ROWS:
                    writer.write_batch(chunk)
                    chunk = {k: [] for k in chunk}
                if max_samples is not None and stats["rows"] >= max_samples:
                    break
            if chunk["seq_len"]:
                writer.write_batch(chunk)
            writer.finalize()
        if not stats["rows"]:
            raise DatasetFormatError(
                f"{dataset_path}: no training rows: every conversation was excluded, had no "
                "assistant turn after the first message, or its context exceeds "
                f"max_seq_len={max_seq_len}"
            )
        final = staging / "dataset"
        _save_dataset(arrow_path, final)
        token_freq_path = final / "token_freq.pt"
        torch.save(dict(token_freq), token_freq_path)
        result = PrepareResult(
            out_dir=out_dir,
            token_freq_path=out_dir / "token_freq.pt",
            num_conversations=stats["conversations"],
            num_rows=stats["rows"],
            num_skipped=stats["excluded"] + stats["without_assistant"],
            num_excluded=stats["excluded"],
            num_without_assistant=stats["without_assistant"],
            num_turns_dropped=stats["turns_dropped"],
            num_truncated_rows=stats["truncated"],
            truncated_loss_tokens=stats["truncated_loss_tokens"],
            total_tokens=sum(lengths),
            loss_tokens=stats["loss_tokens"],
            max_seq_len=max_seq_len,
            mask_source=MASK_SOURCE,
            length_histogram=length_histogram(lengths, max_seq_len),
        )
        (final / "prepare_summary.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(final, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info(
        "prepared %s: %d conversations -> %d rows, %d tokens (%d supervised), %d skipped",
        dataset_path, result.num_conversations, result.num_rows, result.total_tokens,
        result.loss_tokens, result.num_skipped,
    )
    if result.num_skipped or result.num_turns_dropped or result.num_truncated_rows:
        log.warning("dropped: %d conversations excluded by curation, %d without a trainable reply, %d assistant "
                    "turns (context over max_seq_len=%d or an unstable template); %d supervised tokens cut from "
                    "%d rows truncated at max_seq_len", result.num_excluded, result.num_without_assistant,
                    result.num_turns_dropped, max_seq_len, result.truncated_loss_tokens, result.num_truncated_rows)
    return result


def _save_dataset(arrow_path: Path, final: Path) -> None:
    """save_to_disk of the rows with the torch format (recorded in state.json; speculators' reader needs
    it). The fingerprint state.json records is the rows' own sha256, not datasets' default (a hash of the
    temporary path, different on every run), so the same rows give the same files whoever wrote them."""
    import hashlib

    from datasets import Dataset
    from datasets.table import MemoryMappedTable

    digest = hashlib.sha256()
    with open(arrow_path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    ds = Dataset(MemoryMappedTable.from_file(str(arrow_path)), fingerprint=digest.hexdigest()[:16])
    ds.set_format(type="torch")
    ds.save_to_disk(str(final))
    del ds


class _Throttle:
    """Calls on_progress at most ~100 times per run so a database-backed callback stays cheap."""

    def __init__(self, fn: ProgressFn | None, total: int):
        self.fn, self.total, self.last = fn, total, -1
        self.step = max(1, total // 100)

    def __call__(self, done: int, *, force: bool = False) -> None:
        if self.fn is None:
            return
        if force or done - self.last >= self.step:
            self.last = done
            self.fn(min(done, self.total), self.total)
