"""What names a demo build (its files and parameters) and whether one on disk is finished, without
torch or Django: the web tier asks it before it queues a build (a finished one is not queued again),
and workers.stages.demo.assets before it builds."""
from __future__ import annotations

import json
from pathlib import Path

TARGET_DIRNAME = "demo-target"
CHATS_FILENAME = "demo-chats.jsonl"
BUILD_INFO_FILENAME = "demo-build.json"
# Bump when the chats, tokenizer or model recipe changes, so old builds are not reused.
RECIPE_VERSION = 2
DEFAULT_CONVERSATIONS = 2000
DEFAULT_TRAIN_STEPS = 600


def build_params(*, num_conversations: int, train_steps: int, seed: int) -> dict:
    return {"recipe": RECIPE_VERSION, "num_conversations": num_conversations, "train_steps": train_steps, "seed": seed}


def finished_build_info(out_dir: Path, params: dict) -> dict | None:
    """demo-build.json's contents when out_dir holds a finished build made with `params`, else None.
    That file is written last, so a build interrupted half-way has none and is built again. An unreadable
    one (a folder in the way is a file, no permission, not JSON) is not a finished build either: the build
    then fails saying why, on the launch page, rather than this check failing the request for it."""
    out_dir = Path(out_dir)
    try:
        info = json.loads((out_dir / BUILD_INFO_FILENAME).read_text())
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    if not isinstance(info, dict) or info.get("params") != params:
        return None
    target_dir = out_dir / TARGET_DIRNAME
    needed = [out_dir / CHATS_FILENAME, target_dir / "config.json", target_dir / "model.safetensors",
              target_dir / "tokenizer.json"]
    return info if all(p.is_file() for p in needed) else None
