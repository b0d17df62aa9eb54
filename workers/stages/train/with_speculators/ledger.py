"""Which epochs of a speculators training are done, kept beside its checkpoints across attempts.

speculators resumes by itself (`Trainer.setup_trainer`, `BaseCheckpointer._get_previous_epoch`):
it takes the highest numbered folder in `--save-path` (symlinks and `interrupted/` skipped), loads
its model, optimizer and scheduler, and continues at the next epoch with the `global_step` of that
folder's `training_state.json`. It trusts that folder: one cut short by a kill makes it fail, and
one trained from other inputs is resumed all the same. So before each attempt:
- `eagle3web_epochs.json` (this ledger) records, per finished epoch, its checkpoint, train loss,
  validation metrics and global step, written after speculators logged the epoch's validation
  (which it does after saving the checkpoint); it also records a fingerprint of the inputs;
- an epoch counts as done when the ledger has it and its folder is whole (config.json,
  model.safetensors, optimizer_state_dict.pt, an end-of-epoch training_state.json); numbered
  folders from the first epoch that is not done go, so speculators resumes exactly where the
  ledger says; a ledger of other inputs starts the training over;
- `interrupted/`, which speculators saves on SIGTERM but never resumes from, goes too (said in the log).
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from workers.stages.extract.resume import write_json_atomic

log = logging.getLogger(__name__)

LEDGER_NAME = "eagle3web_epochs.json"
LEDGER_FORMAT = 1
INTERRUPTED = "interrupted"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "optimizer_state_dict.pt", "training_state.json")


@dataclass
class EpochDone:
    epoch: int
    path: str
    train_loss: float
    val_metrics: dict
    global_step: int
    profiled_tokens: int = 0  # tokens of the steps speculators timed, and their seconds
    profiled_seconds: float = 0.0


@dataclass
class Ledger:
    fingerprint: str
    epochs: list[EpochDone] = field(default_factory=list)

    @property
    def global_step(self) -> int:
        return self.epochs[-1].global_step if self.epochs else 0


def ledger_path(out_dir: Path) -> Path:
    return Path(out_dir) / LEDGER_NAME


def ledger_save(out_dir: Path, ledger: Ledger) -> None:
    write_json_atomic(ledger_path(out_dir), {"format": LEDGER_FORMAT, "fingerprint": ledger.fingerprint,
                                             "epochs": [vars(e) for e in ledger.epochs]})


def _ledger_read(out_dir: Path) -> dict | None:
    try:
        data = json.loads(ledger_path(out_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s): training starts over", ledger_path(out_dir), exc)
        return None
    return data if isinstance(data, dict) and data.get("format") == LEDGER_FORMAT else None


def checkpoint_whole(epoch_dir: Path, epoch: int) -> bool:
    """The folder holds everything speculators' resume loads, saved at the end of `epoch`."""
    if not all((epoch_dir / name).is_file() for name in CHECKPOINT_FILES):
        return False
    try:
        state = json.loads((epoch_dir / "training_state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("epoch") == epoch and state.get("local_step") == 0


def _remove_epochs_from(out_dir: Path, keep: int) -> None:
    """Numbered folders from `keep` on, their `epoch{n}_*` links, and `checkpoint_best` if it pointed
    at one of them (kept otherwise: speculators reads the best loss so far through it when resuming)."""
    for child in out_dir.iterdir():
        numbered = re.fullmatch(r"epoch(\d+)_\w+", child.name)
        if child.is_symlink() and numbered and int(numbered[1]) >= keep:
            child.unlink()
        elif child.is_dir() and not child.is_symlink() and child.name.isdigit() and int(child.name) >= keep:
            shutil.rmtree(child)
    best = out_dir / "checkpoint_best"
    if best.is_symlink() and not best.exists():
        best.unlink()


def ledger_open(out_dir: Path, *, fingerprint: str) -> Ledger:
    """The epochs an earlier attempt finished with these inputs; the folders past them removed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = _ledger_read(out_dir)
    ledger = Ledger(fingerprint=fingerprint)
    if data is not None and data.get("fingerprint") != fingerprint:
        log.warning("the checkpoints in %s were trained from other inputs or settings: training starts over", out_dir)
    elif data is not None:
        for entry in data.get("epochs", []):
            done = EpochDone(**entry)
            if done.epoch != len(ledger.epochs) or not checkpoint_whole(out_dir / str(done.epoch), done.epoch):
                break
            ledger.epochs.append(done)
    dropped = sorted(int(p.name) for p in out_dir.iterdir()
                     if p.name.isdigit() and p.is_dir() and not p.is_symlink() and int(p.name) >= len(ledger.epochs))
    if dropped:
        log.warning("removing checkpoint folders of epochs %s in %s: not finished with validation by an earlier "
                    "attempt, or trained from other inputs; speculators trains them again", dropped, out_dir)
    _remove_epochs_from(out_dir, len(ledger.epochs))
    interrupted = out_dir / INTERRUPTED
    if interrupted.is_dir() and not interrupted.is_symlink():
        log.warning("removing %s: speculators saved it when an earlier attempt was stopped, but resumes only from "
                    "a finished epoch (here epoch %d)", interrupted, len(ledger.epochs) - 1)
        shutil.rmtree(interrupted)
    ledger_save(out_dir, ledger)
    return ledger
