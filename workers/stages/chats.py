"""Reading chat JSONL files (ShareGPT `conversations` or OpenAI `messages`), one conversation a line.

Pure: no Django, no torch. The web tier catalogues datasets with it; the prepare stage tokenizes
what it yields.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.stages.errors import InputError

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


class DatasetFormatError(InputError):
    """A row of the chat file cannot be read; the message names file, line and problem."""


@dataclass(frozen=True)
class Conversation:
    source_id: str
    line: int  # 1-based, for messages
    messages: list[dict]


def parse_row(raw: str, *, path: Path, line: int) -> Conversation:
    """One JSONL line -> Conversation with roles normalised to system/user/assistant."""
    where = f"{path}, line {line}"
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
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
    raw_id = row.get("id", line - 1)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise DatasetFormatError(f"{where}: 'id' must be a string or integer, got {raw_id!r}")
    messages = [_parse_turn(turn, where=f"{where}, {key}[{i}]") for i, turn in enumerate(turns)]
    return Conversation(source_id=str(raw_id), line=line, messages=messages)


def _parse_turn(turn: object, *, where: str) -> dict:
    if not isinstance(turn, dict):
        raise DatasetFormatError(f"{where}: a turn must be an object, got {type(turn).__name__}")
    role = turn.get("from", turn.get("role"))
    if role is None:
        raise DatasetFormatError(f"{where}: turn has no 'from' or 'role'")
    if role not in ROLE_ALIASES:
        raise DatasetFormatError(
            f"{where}: unknown role {role!r}; expected one of {sorted(ROLE_ALIASES)}"
        )
    content = turn["value"] if "value" in turn else turn.get("content")
    if not isinstance(content, str):
        raise DatasetFormatError(
            f"{where}: content must be a string, got {type(content).__name__} "
            "(multimodal or tool-call turns are not supported)"
        )
    return {"role": ROLE_ALIASES[role], "content": content}


def read_conversations(path: Path) -> Iterator[Conversation]:
    """Yield each non-blank line's conversation; a bad line raises DatasetFormatError."""
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                yield parse_row(raw, path=path, line=lineno)
