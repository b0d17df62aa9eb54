"""The prepare stage's rendering (workers.stages.prepare.stage): a conversation through the target tokenizer's
own chat template into training rows and their loss masks, and what curation excluded.

Mirrors speculators 0.9 `data_generation/preprocessing.py` (what `speculators prepare-data` runs), which
renders through a vLLM `/render` endpoint; we render with the template vLLM would apply, so no server is
needed. The loss mask is upstream's, token for token (tests/stages/prepare/test_prepare_upstream_parity.py runs
upstream's code on the same rows):
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
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from workers.contract.chats.jsonl import Conversation
from workers.contract.errors import InputError

MASK_SOURCE = "render_boundary"  # speculators prepare-data's rule; Preparation.mask_source records it


class ChatTemplateError(InputError):
    """The target tokenizer cannot render conversations into training rows."""


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


class Outcome(NamedTuple):
    """What one conversation became: its rows (empty when excluded) and the assistant turns it lost."""

    source_id: str
    excluded: bool
    rows: list[Row]
    dropped: int


def outcome_of(conv: Conversation, *, renderer: ChatRenderer, max_seq_len: int, ids: frozenset[str],
               hashes: frozenset[str], own_ids: frozenset[str]) -> Outcome:
    if _excluded(conv, ids=ids, hashes=hashes, own_ids=own_ids):
        return Outcome(conv.source_id, True, [], 0)
    rows, dropped = renderer.rows(conv.messages, max_seq_len)
    return Outcome(conv.source_id, False, rows, dropped)


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
