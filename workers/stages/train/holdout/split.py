"""Train/validation split by conversation, held out by content.

Each assistant turn of a conversation is its own prepared row, and a later row holds every earlier
turn as context, so a row-level split puts most validation rows next to training rows of the same
conversation and flatters the validation loss that picks the best checkpoint. The split here keeps
every row of a conversation (same `source_id`) on one side. Datasets without a `source_id` column
(older or imported ones) fall back to one group per row, and the result says so (`by == "row"`).

Ids alone do not hold anything out: chat files repeat prompts under new ids (the demo's 2,000 chats
have hundreds whose first reply follows the same turns as another conversation's). So a conversation
any of whose rows has a prompt context (workers.stages.train.holdout.prompt_keys) that a row of another
conversation also has never validates: it trains, and `held_out_duplicates_removed` counts such
conversations. Validation is then filled, in the seed's order, from the others, so no validation row
and no τ prompt (the first row's context) occurs in training. The count is a property of the data,
not of the seed. Both training backends split here (workers.stages.train.loop and, through
with_speculators/plan.py, speculators' trainer).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workers.contract.errors import InputError

SPLIT_FILENAME = "split.json"

logger = logging.getLogger(__name__)


class SplitError(InputError):
    """The rows cannot be split into a non-empty train and validation side."""


@dataclass(frozen=True)
class SplitInfo:
    by: str  # "conversation", or "row" when the prepared dataset has no source_id column
    seed: int
    val_fraction: float
    train_rows: int
    val_rows: int
    train_conversations: int
    val_conversations: int
    # Conversations kept out of validation because a prompt context of theirs occurs in another
    # conversation; None when the caller gave no prompt keys (nothing was checked: older runs too).
    held_out_duplicates_removed: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _sharing_groups(group_of_row: list[str], prompt_keys: list[str | None]) -> set[str]:
    """The groups that share at least one prompt-context key with another group."""
    owner: dict[str, str] = {}
    sharing: set[str] = set()
    for group, key in zip(group_of_row, prompt_keys):
        if key is None:
            continue
        first = owner.setdefault(key, group)
        if first != group:
            sharing.update((first, group))
    return sharing


def split_train_val(source_ids: list[str] | None, *, val_fraction: float, seed: int, num_rows: int | None = None,
                    prompt_keys: list[str | None] | None = None) -> tuple[list[int], list[int], SplitInfo]:
    """(train row indices, val row indices, SplitInfo), both index lists sorted.

    The distinct conversation ids, in order of first appearance, are shuffled with
    `numpy.random.default_rng(seed)`; whole conversations go to validation, in that order, until it
    holds at least round(n_rows * val_fraction) rows (at least one row), keeping at least one
    conversation for training. `prompt_keys` (one per row, workers.stages.train.holdout.prompt_keys) bar every
    conversation that shares a prompt context with another one from validation; without them only ids
    are compared. `source_ids=None` (no column) splits by row; then `num_rows` gives the row count.
    """
    if not 0.0 < val_fraction < 1.0:
        raise SplitError(f"val_fraction must be in (0, 1), got {val_fraction}")
    by = "conversation" if source_ids is not None else "row"
    if source_ids is None:
        if num_rows is None:
            raise SplitError("split by row needs num_rows")
        source_ids = [str(i) for i in range(num_rows)]
    n_rows = len(source_ids)
    if prompt_keys is not None and len(prompt_keys) != n_rows:
        raise SplitError(f"{len(prompt_keys)} prompt keys for {n_rows} rows")
    rows_of: dict[str, list[int]] = {}
    for i, sid in enumerate(source_ids):
        rows_of.setdefault(sid, []).append(i)
    groups = list(rows_of)
    if len(groups) < 2:
        if groups and by == "conversation":
            raise SplitError(f"cannot split into train and validation: only one conversation (source_id "
                             f"{groups[0]!r}, {n_rows} rows); every row of a conversation stays on one side, "
                             "so at least two conversations are needed")
        raise SplitError(f"cannot split into train and validation: {n_rows} prepared row{'s' * (n_rows != 1)}; "
                         "at least 2 are needed")
    barred = _sharing_groups(source_ids, prompt_keys) if prompt_keys is not None else set()
    # The same permutation as before content was compared, so data without repeated prompts splits as it did.
    order = [groups[int(g)] for g in np.random.default_rng(seed).permutation(len(groups))]
    candidates = [g for g in order if g not in barred]
    if not barred:
        candidates = candidates[:-1]  # the last one in shuffled order stays in training
    want = max(1, round(n_rows * val_fraction))
    val_groups: list[str] = []
    held = 0
    for g in candidates:  # a barred conversation always trains, so training is never left empty
        if held >= want:
            break
        val_groups.append(g)
        held += len(rows_of[g])
    if not val_groups:
        raise SplitError(f"cannot hold out a validation side: every one of the {len(groups)} "
                         f"{'conversations' if by == 'conversation' else 'rows'} shares a prompt context with "
                         "another, so any of them would validate on prompts the draft trains on; remove the "
                         "repeated prompts from the chat file")
    if barred:
        logger.info("train/validation split: %d %s kept out of validation, a prompt context of each also "
                    "occurring in another (they train)", len(barred), "conversations" if by == "conversation" else "rows")
    val_set = set(val_groups)
    val_rows = sorted(i for g in val_groups for i in rows_of[g])
    train_rows = sorted(i for g in groups if g not in val_set for i in rows_of[g])
    info = SplitInfo(by=by, seed=seed, val_fraction=val_fraction, train_rows=len(train_rows),
                     val_rows=len(val_rows), train_conversations=len(groups) - len(val_groups),
                     val_conversations=len(val_groups),
                     held_out_duplicates_removed=len(barred) if prompt_keys is not None else None)
    return train_rows, val_rows, info


def split_record(train_rows: list[int], val_rows: list[int], info: SplitInfo,
                 source_ids: list[str] | None) -> dict:
    """What split.json holds: the row indices of each side and the held-out conversations' ids
    (row indices as strings when the split is by row), so a later evaluation can find them."""
    ids = source_ids if source_ids is not None else [str(i) for i in range(len(train_rows) + len(val_rows))]
    val_conversations = list(dict.fromkeys(ids[i] for i in val_rows))  # in row order
    return {"by": info.by, "seed": info.seed, "val_fraction": info.val_fraction,
            "train_rows": list(train_rows), "val_rows": list(val_rows),
            "val_conversations": val_conversations, "train_conversations": info.train_conversations,
            "held_out_duplicates_removed": info.held_out_duplicates_removed, "sizes": info.as_dict()}


def write_split(out_dir: Path, record: dict) -> Path:
    path = Path(out_dir) / SPLIT_FILENAME
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
