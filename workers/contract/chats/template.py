"""Whether a target directory can answer chats: a model config, a tokenizer and a chat template on disk.

Torch-free: the web tier refuses a regeneration with it before any worker loads the model, and the
regenerate stage checks again where it runs. Where transformers and vLLM look: tokenizer_config.json's
"chat_template" (a string, or a list of named templates), or a chat_template.jinja / chat_template.json
beside it (transformers 4.43+ saves the template there)."""
from __future__ import annotations

from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import read_json_object
from workers.contract.target import TargetConfigError, read_target_config

# Where transformers and vLLM find a tokenizer: a fast tokenizer, a sentencepiece or tiktoken model, or
# a byte-level BPE's vocabulary (vocab.json with merges.txt).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class TargetCannotChat(InputError):
    pass


def target_chat_check(target_dir: Path) -> None:
    """Raise TargetCannotChat naming what the target lacks to answer chats; return when it has it all."""
    target_dir = Path(target_dir)
    if not target_dir.is_dir():
        raise TargetCannotChat(f"target {target_dir} is not a directory")
    try:
        read_target_config(target_dir)
    except TargetConfigError as exc:
        raise TargetCannotChat(f"target {target_dir} cannot be read as a model: {exc}") from None
    if not any((target_dir / name).is_file() for name in TOKENIZER_FILES):
        raise TargetCannotChat(f"target {target_dir} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): "
                               "copy the model's tokenizer beside its weights")
    if any((target_dir / name).is_file() and (target_dir / name).stat().st_size for name in TEMPLATE_FILES):
        return
    config_path = target_dir / "tokenizer_config.json"
    config = read_json_object(config_path, TargetCannotChat) if config_path.is_file() else {}
    template = config.get("chat_template")
    # A list holds named templates ({"name": "default", "template": ...}), as tokenizer_config.json may.
    if isinstance(template, str) and template.strip() or isinstance(template, list) and template:
        return
    raise TargetCannotChat(f"target {target_dir} has no chat template (no \"chat_template\" in tokenizer_config.json, "
                           "no chat_template.jinja), so it cannot be given a conversation to answer: use the chat "
                           "(instruct) version of the model, or add its template")
