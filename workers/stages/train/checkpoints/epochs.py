"""The training stage's checkpoint folders, in speculators' layout (`{epoch}/`, `epoch{n}_end`,
`checkpoint_best`), for workers.stages.train.loop."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from speculators.train.checkpointer import SingleGPUCheckpointer


def clear_previous_run(out_dir: Path, *, keep_epochs: int = 0) -> None:
    """Only speculators-layout entries go: numbered epochs from `keep_epochs` on (those a resumed
    training trains again), their symlinks, and the best-epoch link (chosen again at the end)."""
    for child in out_dir.iterdir():
        numbered = re.fullmatch(r"epoch(\d+)_\w+", child.name)
        if child.is_symlink() and (child.name == "checkpoint_best" or (numbered and int(numbered[1]) >= keep_epochs)):
            child.unlink()
        elif child.is_dir() and not child.is_symlink() and child.name.isdigit() and int(child.name) >= keep_epochs:
            shutil.rmtree(child)


def save_epoch_checkpoint(checkpointer: SingleGPUCheckpointer, model, optimizer, scheduler, *, epoch: int,
                          global_step: int, val_metrics: dict[str, float], write: bool = True) -> Path:
    """Trainer.maybe_save_checkpoint + _save_training_state + save_val_metrics for one epoch. Under
    torch.distributed every rank calls it, one writes (`write`: torch's global rank 0, the rank transformers'
    save_pretrained writes the weights on) and all wait for it at a barrier, as speculators' rank-0 rule means
    to. That rule cannot tell the ranks apart here: it reads the state speculators' own launcher sets
    (speculators.train.distributed.maybe_setup_distributed), which ours does not, so every rank called the
    checkpointer, and a rank read config.json while rank 0 was writing it (JSONDecodeError in
    patch_config_dtype)."""
    epoch_dir = checkpointer.path / str(epoch)
    if write:
        checkpointer.save_checkpoint(model, [optimizer], epoch)
        checkpointer.save_scheduler_state_dict([scheduler], epoch)
        (epoch_dir / "training_state.json").write_text(
            json.dumps({"epoch": epoch, "local_step": 0, "global_step": global_step}))
        link = checkpointer.path / f"epoch{epoch}_end"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(Path(str(epoch)))
        checkpointer.save_val_metrics(epoch, {f"{k}_epoch": v for k, v in val_metrics.items()})
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank reports or reads the epoch before it is whole
    return epoch_dir
