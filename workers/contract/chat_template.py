"""Whether a target directory can answer chats: a tokenizer and a chat template on disk.

Torch-free: the web tier refuses a regeneration with it before any worker loads the model. Where
transformers and vLLM look: tokenizer_config.json's "chat_template" (a string, or a list of named
templates), or a chat_template.jinja / chat_template.json beside it (transformers 4.43+ saves the
template there)."""
from __future__ import annotations

import json
from pathlib import Path

from workers.contract.errors import InputError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


class TargetCannotChat(InputError):
    pass


def _template_in_config(path: Path) -> bool:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TargetCannotChat(f"{path} cannot be read as JSON ({exc})") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    return bool(template)


def target_chat_check(target_dir: Path) -> None:
    """Raise TargetCannotChat naming what is missing; return when a tokenizer and a chat template are there."""
    target_dir = Path(target_dir)
    if not (target_dir / "config.json").is_file():
        raise TargetCannotChat(f"target {target_dir} has no config.json: it is not a model directory")
    if not any((target_dir / name).is_file() for name in TOKENIZER_FILES):
        raise TargetCannotChat(f"target {target_dir} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                               "copy the tokenizer files of the model beside its weights")
    config = target_dir / "tokenizer_config.json"
    if config.is_file() and _template_in_config(config):
        return
    for name in ("chat_template.jinja", "chat_template.json"):
        if (target_dir / name).is_file() and (target_dir / name).stat().st_size > 0:
            return
    raise TargetCannotChat(f"target {target_dir} has no chat template (no \"chat_template\" in tokenizer_config.json, "
                           "no chat_template.jinja): the target could not be given a conversation to answer. Use the "
                           "instruct (chat) version of the model, or add its template")
