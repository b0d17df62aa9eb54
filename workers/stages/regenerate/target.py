"""What the regenerate stage needs of a target directory: that it can chat, its dtype and its length.

Torch-free and cheap: the web tier calls regenerate_check_target when a regeneration is asked for."""
from __future__ import annotations

from pathlib import Path

from workers.contract.jsonfile import read_json_object
from workers.contract.target import TargetConfigError, read_target_config, read_target_json
from workers.stages.regenerate.base import RegenerateError

# Where transformers and vLLM find a tokenizer: a fast tokenizer, a sentencepiece or tiktoken model, or
# a byte-level BPE's vocabulary (vocab.json with merges.txt).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
DTYPES = ("float32", "bfloat16", "float16")


def regenerate_check_target(target_dir: Path) -> None:
    """Raise RegenerateError naming what the target lacks to answer chats: config.json, tokenizer files,
    a chat template (tokenizer_config.json's "chat_template", or chat_template.jinja / .json)."""
    target_dir = Path(target_dir)
    if not target_dir.is_dir():
        raise RegenerateError(f"target {target_dir} is not a directory")
    try:
        read_target_config(target_dir)
    except TargetConfigError as exc:
        raise RegenerateError(f"target {target_dir} cannot be read as a model: {exc}") from None
    if not any((target_dir / name).is_file() for name in TOKENIZER_FILES):
        raise RegenerateError(f"target {target_dir} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): "
                              "copy the model's tokenizer beside its weights")
    if any((target_dir / name).is_file() and (target_dir / name).stat().st_size for name in TEMPLATE_FILES):
        return
    config_path = target_dir / "tokenizer_config.json"
    config = read_json_object(config_path, RegenerateError) if config_path.is_file() else {}
    template = config.get("chat_template")
    # A list holds named templates ({"name": "default", "template": ...}), as tokenizer_config.json may.
    if isinstance(template, str) and template.strip() or isinstance(template, list) and template:
        return
    raise RegenerateError(f"target {target_dir} has no chat template (no \"chat_template\" in tokenizer_config.json, "
                          "no chat_template.jinja), so it cannot be given a conversation to answer: use the chat "
                          "(instruct) version of the model, or add its template")


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
