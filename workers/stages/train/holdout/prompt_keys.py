"""The content key that decides what may be held out: a reply's prompt context, as the target saw it.

A prepared row holds one assistant reply and everything before it (workers/stages/prepare/stage.py); the
tokens before its first supervised token are the rendered system and user turns (and earlier replies)
the reply was written after. For a conversation's first row that is exactly the prompt the evaluate
stage measures τ on (workers/stages/evaluate/prompts.py takes it from here, so the two cannot drift).

The key is the sha256 of those token ids as little-endian int64: our prepare writes int64 and
speculators' prepare-data int32, and a tensor- or list-formatted dataset gives the same ids, so the
key depends on the ids alone. Token ids rather than turn texts, because the rows hold only ids and
because they are what the target and the draft see: a ShareGPT row and an OpenAI row with the same
turns render to the same ids (prepare reads both into the same messages), and so does a missing
system turn where the chat template writes a default one. Texts that differ by a byte (NFC against
NFD, a trailing space) are different prompts to the model and get different keys.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

KEY_BATCH_ROWS = 4096  # rows per Arrow batch: bounded memory on datasets of any size


def context_end(loss_mask: Sequence[int] | np.ndarray) -> int | None:
    """Index of the first supervised token, or None when the row has no context before one (no
    supervised token at all, or a mask that starts at position 0, as some imported rows do)."""
    nonzero = np.flatnonzero(np.asarray(loss_mask))
    if not nonzero.size or nonzero[0] == 0:
        return None
    return int(nonzero[0])


def prompt_context(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[int] | None:
    """The ids a row's reply was written after (the τ prompt for a conversation's first row), or None."""
    end = context_end(loss_mask)
    return None if end is None else [int(t) for t in input_ids[:end]]


def context_key(context_ids: Sequence[int] | np.ndarray) -> str:
    return hashlib.sha256(np.asarray(context_ids, dtype="<i8").tobytes()).hexdigest()


def prompt_context_keys(rows) -> list[str | None]:
    """Per row of a `datasets.Dataset` with `input_ids` and `loss_mask` (any format): the key of its
    prompt context, None for a row without one (it can be compared with nothing, and the evaluate
    stage takes no prompt from it either). Read in Arrow batches, without Python lists of tokens."""
    import pyarrow.compute as pc

    keys: list[str | None] = []
    for batch in rows.with_format("arrow").select_columns(["input_ids", "loss_mask"]).iter(KEY_BATCH_ROWS):
        ids_col = batch.column("input_ids").combine_chunks()
        mask_col = batch.column("loss_mask").combine_chunks()
        ids = pc.list_flatten(ids_col).to_numpy(zero_copy_only=False)
        masks = pc.list_flatten(mask_col).to_numpy(zero_copy_only=False)
        # Own offsets per column: a malformed row whose mask and ids differ in length stays aligned.
        id_starts = np.concatenate([[0], np.cumsum(pc.list_value_length(ids_col).to_numpy(zero_copy_only=False))])
        mask_lengths = pc.list_value_length(mask_col).to_numpy(zero_copy_only=False)
        mask_starts = np.concatenate([[0], np.cumsum(mask_lengths)])
        for r in range(len(mask_lengths)):
            end = context_end(masks[mask_starts[r]:mask_starts[r + 1]])
            keys.append(None if end is None else context_key(ids[id_starts[r]:id_starts[r] + end]))
    return keys


def read_prompt_keys(prepared_dir) -> list[str | None]:
    from datasets import load_from_disk

    return prompt_context_keys(load_from_disk(str(prepared_dir)))
