"""Writing a checkpoint's folder for deployment: what vLLM reads of a speculators checkpoint, and its card.

vLLM (and speculators' `Eagle3DraftModel.from_pretrained`) read `config.json` and the weights
(`model.safetensors`, or shards named by `model.safetensors.index.json`; d2t and t2d live in them).
The optimizer and scheduler state, `training_state.json` and the trainer's other files are for resuming
training, not serving, and stay behind: they are most of a checkpoint's bytes.

The folder appears whole or not at all: everything is written into a hidden sibling, which is renamed
into place last; a failure removes it. An existing folder is never written into. Torch-free.
"""
from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from workers.contract.errors import InputError

CARD_NAME = "README.md"


class ExportError(InputError):
    """The checkpoint cannot be exported as asked; says why."""


@dataclass(frozen=True)
class ExportedFolder:
    path: Path
    files: list[str]  # names in the folder, the card included
    bytes: int


def served_files(checkpoint_dir: Path) -> list[Path]:
    """The files of a checkpoint that serving reads: config.json and the safetensors weights (and index)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / "config.json").is_file():
        raise ExportError(f"{checkpoint_dir} has no config.json: it is not a speculators checkpoint (moved or deleted?)")
    weights = sorted(p for p in checkpoint_dir.iterdir()
                     if p.is_file() and (p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json"))
    if not any(p.name.endswith(".safetensors") for p in weights):
        raise ExportError(f"{checkpoint_dir} has no .safetensors weights: nothing for vLLM to load")
    return [checkpoint_dir / "config.json", *weights]


def export_folder(*, checkpoint_dir: Path, out_dir: Path, card_text: str) -> ExportedFolder:
    """Copy the served files of `checkpoint_dir` and write the card, as the new folder `out_dir`."""
    out_dir = Path(out_dir)
    if out_dir.exists() or out_dir.is_symlink():
        raise ExportError(f"output folder {out_dir} already exists: name a new folder (an export never writes "
                          "into one, so nothing there is overwritten)")
    files = served_files(Path(checkpoint_dir))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        for path in files:
            shutil.copyfile(path, staging / path.name)
        (staging / CARD_NAME).write_text(card_text, encoding="utf-8")
        os.rename(staging, out_dir)  # fails, rather than merging, if out_dir appeared meanwhile
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    names = sorted(p.name for p in out_dir.iterdir())
    return ExportedFolder(path=out_dir, files=names, bytes=sum((out_dir / n).stat().st_size for n in names))
