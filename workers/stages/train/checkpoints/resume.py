"""Resuming a training: the state a retried attempt continues from, saved beside the checkpoints.

`out_dir/resume/state.pt` holds what the next step needs and the epoch checkpoints do not: model,
optimizer and scheduler state, the epoch and batch reached, the global step, every RNG's state, and
the running figures (per-epoch losses and supervised tokens, tokens and seconds trained) so that a
resumed run reports what one uninterrupted run would. It is written whole (temp file, fsync,
rename) after the metrics up to its step were handed on, and read with `weights_only=True` only.

The state also records what it was trained from (a fingerprint: target, prepared rows, hidden
states, vocab mapping, split, hyperparameters, step plan). A state from other inputs, or one that
cannot be read, is ignored and training starts at step 0.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from workers.stages.extract.resume import files_signature

log = logging.getLogger(__name__)

STATE_FORMAT = 1
RESUME_DIRNAME = "resume"
STATE_NAME = "state.pt"


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dir_summary(directory: Path) -> list:
    """[files, bytes, newest mtime_ns]: changes when an extraction is redone, costs a stat per file."""
    files = files_signature(directory)
    return [len(files), sum(f[1] for f in files), max((f[2] for f in files), default=0)]


def train_fingerprint(*, target_dir: Path, prepared_dir: Path, hidden_states: list, d2t_path: Path,
                      t2d_path: Path, train_rows: list[int], val_rows: list[int], plans: list[list[list[int]]],
                      hyper: dict) -> str:
    """What a training is made from, as one JSON string; equal strings mean a state may be resumed."""
    rows = hashlib.sha256(json.dumps([train_rows, val_rows, plans]).encode()).hexdigest()
    return json.dumps({
        "format": STATE_FORMAT,
        "target": [str(Path(target_dir).resolve()), _sha256(Path(target_dir) / "config.json")],
        "prepared": [str(Path(prepared_dir).resolve()), files_signature(Path(prepared_dir))],
        "hidden_states": hidden_states,  # the dataset's identity(): an extraction's folder and summary, or online
        "vocab": [_sha256(d2t_path), _sha256(t2d_path)],
        "split_and_plan_sha256": rows,
        "hyper": hyper,
    }, sort_keys=True)


@dataclass
class Progress:
    """The running figures of a training, carried across attempts."""

    epoch: int = 0  # the epoch in progress; every epoch before it is finished and checkpointed
    local_step: int = 0  # batches of that epoch already trained
    global_step: int = 0
    epoch_rows: list = field(default_factory=list)  # [epoch, checkpoint path, train loss, val metrics]
    loss_tokens_per_epoch: list = field(default_factory=list)
    losses: list = field(default_factory=list)  # the epoch in progress's train losses so far
    loss_tokens: int = 0  # the epoch in progress's supervised tokens so far
    train_tokens: int = 0
    train_seconds: float = 0.0

    def as_state(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _rng_state() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, ints, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": [version, list(ints), py_gauss],
    }


def _rng_restore(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    n = rng["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, ints, gauss = rng["python"]
    random.setstate((version, tuple(ints), gauss))


def state_path(out_dir: Path) -> Path:
    return Path(out_dir) / RESUME_DIRNAME / STATE_NAME


def save_state(out_dir: Path, *, fingerprint: str, model, optimizer, scheduler, progress: Progress) -> Path:
    """Write the resume state whole: a kill leaves the previous state or this one, never half of one."""
    path = state_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    state = {"format": STATE_FORMAT, "fingerprint": fingerprint, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "progress": progress.as_state(), "rng": _rng_state()}
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def load_state(out_dir: Path, *, fingerprint: str) -> dict | None:
    """The saved state when it is readable and was made from the same inputs; else None."""
    path = state_path(out_dir)
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable state is a reason to start over, not to fail
        log.warning("%s cannot be read (%s): training starts over", path, str(exc).splitlines()[0][:200])
        return None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        log.warning("%s is not a resume state this version writes: training starts over", path)
        return None
    if state.get("fingerprint") != fingerprint:
        log.warning("%s was saved for other inputs or settings: training starts over", path)
        return None
    return state


def restore(state: dict, *, model, optimizer, scheduler) -> Progress:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])  # moves its tensors to the parameters' device
    scheduler.load_state_dict(state["scheduler"])
    _rng_restore(state["rng"])
    return Progress(**state["progress"])


def discard_state(out_dir: Path) -> None:
    for name in (STATE_NAME, STATE_NAME + ".tmp"):
        (Path(out_dir) / RESUME_DIRNAME / name).unlink(missing_ok=True)


def remaining_plan(plan: list[list[int]], lengths: list[int], batches_done: int) -> list[list[int]]:
    """The plan after its first `batches_done` trained batches. iter_batches skips groups without a
    token to predict (rows under 2 tokens), so trained batches are counted as it counts them."""
    seen = 0
    for position, rows in enumerate(plan):
        if seen == batches_done:
            return plan[position:]
        if sum(max(0, lengths[i] - 1) for i in rows) > 0:
            seen += 1
    return []
