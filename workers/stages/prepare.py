"""Prepare stage: a JSONL chat file -> speculators 0.9 prepared dataset + token_freq.pt.

Mirrors speculators 0.9 `data_generation/preprocessing.py` (what `speculators prepare-data`
runs), which renders through a vLLM `/render` endpoint; we render with the target tokenizer's
own chat template (the template vLLM would apply) so no server is needed. The loss mask is
upstream's, token for token (tests/stages/test_prepare_upstream_parity.py runs upstream's code
on the same rows):
- `_render_boundary_rows` (preprocessing.py:244-321): every assistant turn j > 0 becomes its
  own row holding the conversation through turn j; the boundary is where the full render of
  conv[:j+1] extends the generation-prompt render of conv[:j]; earlier tokens are context
  (mask 0), every later token is 1 (preprocessing.py:316): the reply, its end-of-turn token and
  whatever the template writes after it (the demo template's newline). Templates that mark
  assistant text with `{% generation %}` are not narrowed to those blocks: upstream ignores the
  tags, and narrowing made our token counts and draft vocabularies differ from upstream's on
  the same chats. A turn whose context alone fills max_seq_len is skipped; trailing
  non-assistant turns produce nothing.
- A conversation whose renders diverge inside the history (`BoundaryUnstableError`) loses all
  its rows, as upstream's `_render_conversation_rows` catches the error for the whole
  conversation (preprocessing.py:363-376); its assistant turns count as dropped.
- `_append_row`: clip to max_seq_len, drop rows with no supervised token, input_ids/loss_mask
  as int64 and seq_len as int. A clipped row keeps its head, so the reply at its end is what is
  lost; the result counts those supervised tokens (`truncated_loss_tokens`) next to the rows.
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
from typing import NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from workers.contract.chats import (  # noqa: E402,F401 - re-exported for callers of prepare
    ROLE_ALIASES,
    Conversation,
    DatasetFormatError,
    _parse_turn,
    parse_row,
    read_conversations,
)
from workers.contract.errors import InputError  # noqa: E402
from workers.contract.progress import ProgressFn  # noqa: E402

log = logging.getLogger(__name__)


MASK_SOURCE = "render_boundary"  # speculators prepare-data's rule; Preparation.mask_source records it
HISTOGRAM_BINS = 20
WRITE_CHUNK_ROWS = 512


class ChatTemplateError(InputError):
    """The target tokenizer cannot render conversations into training rows."""


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


class _BoundaryUnstable(ValueError):
    pass


class Row(NamedTuple):
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool
    truncated_loss_tokens: int = 0  # supervised tokens cut off at max_seq_len


class ChatRenderer:
    """Renders conversations with a tokenizer's chat template into per-turn training rows."""

    def __init__(self, tokenizer):
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ChatTemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')} has no chat_template; "
                "add one to tokenizer_config.json (or chat_template.jinja)"
            )
        self.tokenizer = tokenizer

    def _ids(self, messages: list[dict], *, add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
        )
        return list(out["input_ids"])

    def _boundary(self, history: list[dict], prompt_ids: list[int], full_ids: list[int]) -> int:
        # speculators _render_boundary_rows: the prompt render is usually a prefix of the full
        # one; templates that pre-fill a reasoning scaffold diverge after the history, so fall
        # back to the common prefix, valid only if the history itself renders identically.
        if full_ids[: len(prompt_ids)] == prompt_ids:
            return len(prompt_ids)
        boundary = 0
        for a, b in zip(prompt_ids, full_ids):
            if a != b:
                break
            boundary += 1
        hist_ids = self._ids(history, add_generation_prompt=False)
        if full_ids[: len(hist_ids)] != hist_ids or boundary < len(hist_ids):
            raise _BoundaryUnstable("prompt and full renders diverge inside the history")
        return boundary

    def rows(self, messages: list[dict], max_seq_len: int) -> tuple[list[Row], int]:
        """(rows clipped to max_seq_len, assistant turns dropped)."""
        rows, dropped = [], 0
        for j, turn in enumerate(messages):
            if turn["role"] != "assistant" or j == 0:
                continue
            prompt_ids = self._ids(messages[:j], add_generation_prompt=True)
            if len(prompt_ids) >= max_seq_len:
                dropped += 1  # a later turn may fit again (templates that strip history)
                continue
            full_ids = self._ids(messages[: j + 1], add_generation_prompt=False)
            try:
                boundary = self._boundary(messages[:j], prompt_ids, full_ids)
            except _BoundaryUnstable:
                # Upstream drops the whole conversation here, rows already built included.
                return [], sum(1 for i, t in enumerate(messages) if t["role"] == "assistant" and i > 0)
            mask = [0] * boundary + [1] * (len(full_ids) - boundary)
            truncated = len(full_ids) > max_seq_len
            cut_loss = sum(mask[max_seq_len:])
            full_ids, mask = full_ids[:max_seq_len], mask[:max_seq_len]
            if not any(mask):
                dropped += 1  # the whole reply lay beyond max_seq_len: counted as a dropped turn
                continue
            rows.append(Row(full_ids, mask, truncated, cut_loss))
        return rows, dropped


def load_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


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


class Outcome(NamedTuple):
    """What one conversation became: its rows (empty when excluded) and the assistant turns it lost."""

    source_id: str
    excluded: bool
    rows: list[Row]
    dropped: int


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

    One shard's part of a preparation (issue 36) is workers.stages.prepare_merge.prepare_shard's.
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


def outcome_of(conv: Conversation, *, renderer: ChatRenderer, max_seq_len: int, ids: frozenset[str],
               hashes: frozenset[str], own_ids: frozenset[str]) -> Outcome:
    if _excluded(conv, ids=ids, hashes=hashes, own_ids=own_ids):
        return Outcome(conv.source_id, True, [], 0)
    rows, dropped = renderer.rows(conv.messages, max_seq_len)
    return Outcome(conv.source_id, False, rows, dropped)


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


def _excluded(conv: Conversation, *, ids: frozenset[str], hashes: frozenset[str], own_ids: frozenset[str]) -> bool:
    """Whether curation excluded this conversation.

    A row without an "id" is keyed by its line index, which names another conversation once a line
    is inserted above it, so it is matched by content; a row's own "id" is the file author's stable
    key and stays the match (identical conversations under other ids are not excluded with it)."""
    if conv.source_id in ids:
        return True
    if conv.keyed_by_line:
        return bool(hashes) and conv.content_hash in hashes
    return conv.source_id in own_ids


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
