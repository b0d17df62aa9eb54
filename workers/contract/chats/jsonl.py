"""Reading chat JSONL files (ShareGPT `conversations` or OpenAI `messages`), one conversation a line.

Pure: no Django, no torch. The web tier catalogues datasets with it; the prepare stage tokenizes
what it yields.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import parse_json
from workers.contract.inputs.regular_file import open_regular

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


# Bounded input. A line is read in READ_CHUNK_BYTES pieces and refused as soon as it passes
# MAX_LINE_BYTES, so at most about that much of one line is ever held, however long the line is.
MAX_LINE_BYTES = 16 * 1024 * 1024  # one conversation, newline included (~4M tokens of text)
READ_CHUNK_BYTES = 1024 * 1024
MAX_TURNS = 10_000  # turns in one conversation
MAX_ID_CHARS = 200  # a row's "id": DatasetSample.sample_id's column
MAX_ROLE_CHARS = 50


class DatasetFormatError(InputError):
    """A row of the chat file cannot be read; the message names file, line and problem."""


def _shown(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_text(text: str, *, where: str, what: str) -> None:
    """Text the catalogue stores: no NUL (PostgreSQL text cannot hold it), no lone surrogates."""
    if "\x00" in text:
        raise DatasetFormatError(f"{where}: {what} holds a NUL character (\\u0000); remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DatasetFormatError(f"{where}: {what} holds a lone surrogate escape (e.g. \\ud800), "
                                 "which is not valid text") from None


def content_hash(messages: list[dict]) -> str:
    """sha256 hex of the normalised turns (role, content, thinking when present) as canonical JSON.

    A row without an "id" is keyed by its line index, which names another conversation once a line
    is inserted above it; curation follows this hash instead. `reasoning_content` is left out: it
    is the same text as `thinking` (see _parse_turn), so both spellings of a file hash alike."""
    turns = [{k: m[k] for k in ("role", "content", "thinking") if k in m} for m in messages]
    blob = json.dumps(turns, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Conversation:
    source_id: str
    line: int  # 1-based, for messages
    messages: list[dict]
    keyed_by_line: bool = False  # no "id" in the row: source_id is the 0-based line index

    @cached_property
    def content_hash(self) -> str:
        return content_hash(self.messages)


def parse_row(raw: str, *, path: Path, line: int) -> Conversation:
    """One JSONL line -> Conversation with roles normalised to system/user/assistant."""
    where = f"{path}, line {line}"
    row = parse_json(raw, where=where, error=DatasetFormatError, one_line=True)
    if not isinstance(row, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "conversations" in row:
        key, turns = "conversations", row["conversations"]
    elif "messages" in row:
        key, turns = "messages", row["messages"]
    else:
        raise DatasetFormatError(
            f"{where}: no 'conversations' (ShareGPT) or 'messages' (OpenAI) list; keys are {sorted(row)}"
        )
    if not isinstance(turns, list):
        raise DatasetFormatError(f"{where}: '{key}' must be a list, got {type(turns).__name__}")
    if len(turns) > MAX_TURNS:
        raise DatasetFormatError(f"{where}: '{key}' has {len(turns)} turns; at most {MAX_TURNS} per conversation")
    keyed_by_line = "id" not in row
    raw_id = row.get("id", line - 1)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise DatasetFormatError(f"{where}: 'id' must be a string or integer, got {_shown(raw_id)}")
    source_id = str(raw_id)
    if not source_id or len(source_id) > MAX_ID_CHARS:
        raise DatasetFormatError(f"{where}: 'id' must be 1..{MAX_ID_CHARS} characters, got {_shown(raw_id)}")
    _check_text(source_id, where=where, what="'id'")
    messages = [_parse_turn(turn, where=f"{where}, {key}[{i}]") for i, turn in enumerate(turns)]
    return Conversation(source_id=source_id, line=line, messages=messages, keyed_by_line=keyed_by_line)


def _parse_turn(turn: object, *, where: str) -> dict:
    if not isinstance(turn, dict):
        raise DatasetFormatError(f"{where}: a turn must be an object, got {type(turn).__name__}")
    role = turn.get("from", turn.get("role"))
    if role is None:
        raise DatasetFormatError(f"{where}: turn has no 'from' or 'role'")
    if not isinstance(role, str) or role not in ROLE_ALIASES:
        raise DatasetFormatError(
            f"{where}: unknown role {_shown(role)}; expected one of {sorted(ROLE_ALIASES)}"
        )
    content = turn["value"] if "value" in turn else turn.get("content")
    if not isinstance(content, str):
        raise DatasetFormatError(
            f"{where}: content must be a string, got {type(content).__name__} "
            "(multimodal or tool-call turns are not supported)"
        )
    _check_text(content, where=where, what="content")
    parsed = {"role": ROLE_ALIASES[role], "content": content}
    # speculators' _normalize_conversation hands recorded reasoning to the chat template under
    # both names (preprocessing.py:145-148); templates such as Qwen3's render it, so the tokens
    # and the render boundary depend on it.
    thinking = turn.get("thinking") or turn.get("reasoning_content")
    if thinking:
        if not isinstance(thinking, str):
            raise DatasetFormatError(f"{where}: 'thinking'/'reasoning_content' must be a string, "
                                     f"got {type(thinking).__name__}")
        _check_text(thinking, where=where, what="reasoning")
        parsed["thinking"] = parsed["reasoning_content"] = thinking
    return parsed


def _read_line(fh, *, path: Path, lineno: int) -> bytearray:
    """The next line's bytes (b"" at the end), never holding more than MAX_LINE_BYTES + a chunk."""
    buf = bytearray()
    while True:
        piece = fh.readline(READ_CHUNK_BYTES)
        if not piece:
            return buf
        buf += piece
        if len(buf) > MAX_LINE_BYTES:
            raise DatasetFormatError(
                f"{path}, line {lineno}: longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB, the limit for "
                "one conversation; split or drop it"
            )
        if piece.endswith(b"\n"):
            return buf


def read_conversations(path: Path, *, on_position: Callable[[int], None] | None = None) -> Iterator[Conversation]:
    """Yield each non-blank line's conversation; a bad line raises DatasetFormatError.

    Lines are read as bytes with a size limit, so a huge line costs at most about MAX_LINE_BYTES.
    `on_position` hears the byte offset reached after each line (for progress over large files)."""
    with open_regular(path) as fh:
        lineno = 0
        while True:
            lineno += 1
            blob = _read_line(fh, path=path, lineno=lineno)
            if on_position is not None:
                on_position(fh.tell())
            if not blob:
                return
            try:
                raw = blob.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetFormatError(
                    f"{path}, line {lineno}: not UTF-8 text (byte {exc.start} of the line); save the file as UTF-8"
                ) from None
            del blob
            if raw.strip():
                yield parse_row(raw, path=path, line=lineno)
