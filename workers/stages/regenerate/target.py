"""What the regenerate stage needs of a target directory: that it can chat, its dtype and its length.

Torch-free and cheap; the chat check itself is workers.contract.chats.template's, which the web tier runs too."""
from __future__ import annotations

from pathlib import Path

from workers.contract.chats.template import TargetCannotChat, target_chat_check
from workers.contract.target import read_target_json
from workers.stages.regenerate.base import RegenerateError

DTYPES = ("float32", "bfloat16", "float16")


def regenerate_check_target(target_dir: Path) -> None:
    """Raise RegenerateError naming what the target lacks to answer chats (workers.contract's check, the
    one the web tier runs before queueing: the directory may have changed since)."""
    try:
        target_chat_check(target_dir)
    except TargetCannotChat as exc:
        raise RegenerateError(str(exc)) from None


def _text_config(target_dir: Path) -> dict:
    raw = read_target_json(target_dir)
    return raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw


def target_dtype(target_dir: Path) -> str:
    """The dtype both backends run the target in: its config's, float32 when it names none (what
    transformers loads then). Named explicitly to vLLM, which would otherwise pick its own."""
    config = _text_config(target_dir)
    raw = read_target_json(target_dir)
    for value in (config.get("dtype"), config.get("torch_dtype"), raw.get("dtype"), raw.get("torch_dtype")):
        if value in DTYPES:
            return value
    return "float32"


def target_max_model_len(target_dir: Path, asked: int | None) -> int:
    """Prompt plus reply tokens a conversation's turn may take: `asked`, else the target's positions."""
    positions = _text_config(target_dir).get("max_position_embeddings")
    positions = positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 1 else None
    if asked is not None:
        if positions is not None and asked > positions:
            raise RegenerateError(f"max_model_len {asked} is more than the target's {positions} positions")
        return asked
    if positions is None:
        raise RegenerateError(f"target {target_dir}: config.json names no max_position_embeddings; give max_model_len")
    return positions
