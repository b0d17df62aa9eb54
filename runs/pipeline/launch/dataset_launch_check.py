"""Whether a launch's chat file can give the prepare stage one training row, from a quick read of its head.

The prepare stage (workers/stages/prepare/stage.py) fails after the launch with "no training rows" when the file
is empty or no conversation in it trains; a launch refuses such a file now, naming the file and counting
why, with nothing stored. A conversation trains when an assistant turn follows its first message
(prepare's rows start at the second turn) and the text before that reply is shorter than max_seq_len
tokens (a longer context leaves no reply token in the row).

Bounded: at most HEAD_CONVERSATIONS conversations or HEAD_BYTES of the file are read (a multi-GB file costs
the launch about a second), and a refusal says how much was read. The context length is counted with the
target's tokenizer.json (the `tokenizers` library, no model, no chat template): the tokens of the turns'
text alone, which the rendered prompt can only exceed (the template adds role headers), so a context
counted at max_seq_len or more is one prepare drops too. Without a tokenizer.json that check is left to
prepare. A malformed line is refused at its first occurrence by the read itself (DatasetFormatError).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from runs.pipeline.launch.setting_bounds import RunConfigError
from workers.contract.chats.jsonl import Conversation, read_conversations

HEAD_CONVERSATIONS = 1000
HEAD_BYTES = 32 * 1024 * 1024
# A tokenizer.json larger than this is not read here (the largest public vocabularies' are ~35 MB).
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
# A turn's text is counted from at most this many characters per max_seq_len token: a token longer than
# that on average is unheard of, and a turn cut there and still short is taken as fitting (prepare decides).
CHARS_PER_TOKEN_BOUND = 32


@dataclass(frozen=True)
class DatasetHead:
    conversations: list[Conversation]
    whole_file: bool  # every line of the file was read
    bytes_read: int
    size_bytes: int


class _HeadRead(Exception):
    pass


def dataset_head(path: Path) -> DatasetHead:
    """The file's first conversations, up to the bounds above; a bad line raises naming file and line."""
    path = Path(path)
    size = path.stat().st_size
    conversations: list[Conversation] = []
    position = 0

    def bounded(pos: int) -> None:
        nonlocal position
        position = pos
        if pos >= HEAD_BYTES:  # checked per line read, blank ones included
            raise _HeadRead

    whole = True
    try:
        for conv in read_conversations(path, on_position=bounded):
            conversations.append(conv)
            if len(conversations) >= HEAD_CONVERSATIONS:
                whole = position >= size
                break
    except _HeadRead:
        whole = position >= size
    return DatasetHead(conversations=conversations, whole_file=whole, bytes_read=position, size_bytes=size)


def _size_words(n: int) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"


@functools.lru_cache(maxsize=16)
def _tokenizer(path: str, size: int, mtime_ns: int):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception:  # noqa: BLE001 - any unreadable tokenizer leaves the length check to prepare, which names it
        return None


def target_tokenizer(target_dir: Path):
    """The target's tokenizer.json as a `tokenizers.Tokenizer`, or None where there is none to read."""
    path = Path(target_dir) / "tokenizer.json"
    try:
        stat = path.stat()
    except OSError:
        return None
    if stat.st_size > MAX_TOKENIZER_BYTES:
        return None
    return _tokenizer(str(path), stat.st_size, stat.st_mtime_ns)


def _context_fits(conv: Conversation, *, tokenizer, max_seq_len: int) -> bool | None:
    """None: no assistant turn after the first message; else whether some reply's context (the turns
    before it, text only) counts fewer than max_seq_len tokens."""
    replies = [j for j, turn in enumerate(conv.messages) if turn["role"] == "assistant" and j > 0]
    if not replies:
        return None
    if tokenizer is None:
        return True
    limit = max_seq_len * CHARS_PER_TOKEN_BOUND
    tokens, counted = 0, 0
    for j in replies:
        for turn in conv.messages[counted:j]:
            text = turn["content"]
            tokens += len(tokenizer.encode(text[:limit], add_special_tokens=False).ids)
            if len(text) > limit and tokens < max_seq_len:
                return True  # cut before reaching max_seq_len: not counted as too long
        counted = j
        if tokens < max_seq_len:
            return True
    return False


def dataset_launch_check(*, path: Path, max_seq_len: int, target_dir: Path) -> None:
    """RunConfigError on dataset_path when the file is empty or none of its first conversations would give
    the prepare stage a training row, with the count of each reason."""
    path = Path(path)
    head = dataset_head(path)
    if head.size_bytes == 0:
        raise RunConfigError(f"{path} is empty (0 bytes): give a JSONL file with one conversation a line, "
                             'e.g. {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}',
                             field="dataset_path")
    if not head.conversations:
        raise RunConfigError(f"{path} holds only blank lines ({_size_words(head.size_bytes)}): no conversation to "
                             "train on; give a JSONL file with one conversation a line", field="dataset_path")
    tokenizer = target_tokenizer(target_dir)
    no_reply = too_long = 0
    for conv in head.conversations:
        try:
            fits = _context_fits(conv, tokenizer=tokenizer, max_seq_len=max_seq_len)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot encode the text: prepare, which loads it, names why
            return
        if fits:
            return
        if fits is None:
            no_reply += 1
        else:
            too_long += 1
    n = len(head.conversations)
    scope = (f"its {n:,} conversation{'s' if n != 1 else ''}" if head.whole_file else
             f"the first {n:,} conversations read at launch (the first {_size_words(head.bytes_read)} of "
             f"{_size_words(head.size_bytes)})")
    reasons = []
    if no_reply:
        reasons.append(f"{no_reply:,} {'has' if no_reply == 1 else 'have'} no assistant turn after the first message")
    if too_long:
        reasons.append(f"{too_long:,} {'has' if too_long == 1 else 'have'} max_seq_len={max_seq_len:,} tokens or "
                       "more before every assistant reply (counted with the target's tokenizer)")
    advice = ("raise max_seq_len" if too_long and not no_reply else
              "give conversations where an assistant replies to a user" + (" or raise max_seq_len" if too_long else ""))
    raise RunConfigError(f"{path}: no usable conversation in {scope}: {'; '.join(reasons)}. Nothing would be "
                         f"trained: {advice}", field="dataset_path")
