"""Where `build_demo_assets` puts the offline demo target and chats, so forms can offer them."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings


def demo_dir() -> Path:
    return settings.DATA_DIR / "demo"


def demo_paths() -> dict[str, str]:
    """Paths of the built demo assets, or {} when they have not been built."""
    base = demo_dir()
    target, chats = base / "demo-target", base / "demo-chats.jsonl"
    if (target / "config.json").exists() and chats.exists():
        return {"target_path": str(target), "dataset_path": str(chats)}
    return {}
