"""The source's conversations and what each becomes: the walk over its turns and the row written.

A conversation is answered turn by turn, as speculators' `regenerate-responses` does
(cli/regenerate_responses.py: extract_conversation, regenerate_conversation): system turns are kept,
every user turn is answered by the target given the regenerated history before it, and the source's
own assistant turns are dropped, so a run of them after a user turn becomes the one new reply and one
before any user turn is gone. The written row keeps its file's format (ShareGPT `conversations` with
from/value, OpenAI `messages`) and spelling, and every other key of the source row.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from workers.contract.chats.jsonl import Conversation, DatasetFormatError, _read_line, parse_row
from workers.stages.regenerate.base import ConversationFailed, Reply, RegenerateError, turn_seed

Answer = Callable[[list[dict], int], Reply]  # (history as role/content dicts, seed) -> the target's reply


@dataclass(frozen=True)
class Exclusions:
    """Curation's exclusions, read as the prepare stage reads them (workers/stages/prepare/stage.py _excluded):
    `ids` by source id whatever the row; a row without an "id" (keyed by its line) by content hash; a
    row's own "id" by `own_ids`."""

    ids: frozenset[str] = frozenset()
    hashes: frozenset[str] = frozenset()
    own_ids: frozenset[str] = frozenset()

    def excludes(self, conv: Conversation) -> bool:
        if conv.source_id in self.ids:
            return True
        if conv.keyed_by_line:
            return bool(self.hashes) and conv.content_hash in self.hashes
        return conv.source_id in self.own_ids


@dataclass
class Scan:
    """The conversations to regenerate, by 1-based line, chosen before any model loads."""

    ids: dict[int, str] = field(default_factory=dict)  # line -> source id, in file order
    duplicates: dict[int, int] = field(default_factory=dict)  # line -> the earlier line with its id
    skipped_excluded: int = 0
    with_user_turn: int = 0


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def iter_rows(path: Path) -> Iterator[tuple[Conversation, dict]]:
    """Each non-blank line's conversation (read by workers.contract.chats.jsonl, with its limits and errors)
    and the row's JSON object as written."""
    with open(path, "rb") as fh:
        lineno = 0
        while True:
            lineno += 1
            blob = _read_line(fh, path=path, lineno=lineno)
            if not blob:
                return
            try:
                raw = blob.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetFormatError(f"{path}, line {lineno}: not UTF-8 text (byte {exc.start} of the line); "
                                         "save the file as UTF-8") from None
            if raw.strip():
                conv = parse_row(raw, path=path, line=lineno)
                yield conv, json.loads(raw)


def scan_source(path: Path, *, exclusions: Exclusions, max_samples: int | None) -> Scan:
    """Read every row once (a bad line fails here, before a model or server starts) and choose the
    first max_samples conversations that are not excluded."""
    scan, first_line = Scan(), {}
    for conv, _ in iter_rows(path):
        if max_samples is not None and len(scan.ids) >= max_samples:
            break
        if exclusions.excludes(conv):
            scan.skipped_excluded += 1
            continue
        scan.ids[conv.line] = conv.source_id
        if conv.source_id in first_line:
            scan.duplicates[conv.line] = first_line[conv.source_id]
        else:
            first_line[conv.source_id] = conv.line
        scan.with_user_turn += any(m["role"] == "user" for m in conv.messages)
    return scan


def _turn_style(turns: list[dict], sharegpt: bool) -> tuple[str, str, str]:
    """(role key, content key, the assistant's name) as the row spells them: a ShareGPT row may use
    from/value or role/content, and gpt or assistant."""
    first = next((t for t in turns if isinstance(t, dict)), {})
    role_key = "from" if "from" in first else "role"
    content_key = "value" if "value" in first else "content"
    named = next((t.get("from", t.get("role")) for t in turns
                  if isinstance(t, dict) and t.get("from", t.get("role")) in ("gpt", "assistant")), None)
    return role_key, content_key, named or ("gpt" if sharegpt and role_key == "from" else "assistant")


def clean_reply(text: str) -> str:
    """A reply as text our chats reader accepts back: a NUL byte (which a model can emit, and which
    PostgreSQL cannot store) is dropped."""
    return text.replace("\x00", "")


def answer_conversation(conv: Conversation, row: dict, *, answer: Answer, seed: int,
                        check: Callable[[], None] = lambda: None) -> dict:
    """The row to write, the target's replies in place of the source's; `check` runs before each
    reply (it raises to stop). Raises ConversationFailed when the conversation has no user turn."""
    if not any(m["role"] == "user" for m in conv.messages):
        raise ConversationFailed("no user turn to answer")
    key = "conversations" if "conversations" in row else "messages"
    role_key, content_key, assistant = _turn_style(row[key], sharegpt=key == "conversations")
    history: list[dict] = []
    written: list[dict] = []
    cut_turns: list[int] = []
    tokens = replies = 0
    for message, source_turn in zip(conv.messages, row[key]):
        if message["role"] == "assistant":
            continue  # the source's reply: the target's takes its place
        history.append({"role": message["role"], "content": message["content"]})
        written.append(source_turn)
        if message["role"] != "user":
            continue
        check()
        reply = answer(history, turn_seed(seed, conv.source_id, replies))
        text = clean_reply(reply.text)
        history.append({"role": "assistant", "content": text})
        if reply.cut:
            cut_turns.append(len(written))
        written.append({role_key: assistant, content_key: text})
        tokens += reply.tokens
        replies += 1
    out = {k: v for k, v in row.items() if k not in ("id", key, "regenerated")}
    return {"id": conv.source_id, **out, key: written,
            "regenerated": {"turns": replies, "cut_turns": cut_turns, "tokens": tokens}}


def check_answerable(scan: Scan, source_path: Path) -> None:
    if not scan.ids:
        raise RegenerateError(f"{source_path}: no conversation to regenerate (the file is empty, or curation "
                              f"excluded all {scan.skipped_excluded})")
    if not scan.with_user_turn:
        raise RegenerateError(f"{source_path}: none of its {len(scan.ids)} conversations has a user turn, so the "
                              "target has nothing to answer; is the file's role naming (user/human) right?")
