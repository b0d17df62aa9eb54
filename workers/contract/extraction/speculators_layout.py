"""One directory that `speculators train --data-path` reads as is, made of links into a run.

A run keeps what speculators 0.9 keeps in one data directory in three places: `prepared/` (the
`save_to_disk` dataset and `token_freq.pt`), the extraction's `hidden_states/hs_{i}.safetensors`
and `vocab/d2t-{N}.npy`, `t2d-{N}.npy`. speculators looks for them under its `--data-path`:
- `train/data.py ArrowDataset.__init__`: `load_from_disk(data_path)`, so the dataset's own files
  (`state.json`, `dataset_info.json`, `data-*.arrow`) must sit in it; and the file backend reads
  `data_path/hidden_states/hs_{i}.safetensors` unless `--hidden-states-path` is given
  (hs_connectors/transfer.py FileBackend.from_train_args);
- `train/cli.py parse_vocab_mappings`: with `--draft-vocab-size N` and no `--d2t-path/--t2d-path`,
  `data_path/d2t-{N}.npy` and `t2d-{N}.npy`; without them `data_path/token_freq.pt`.

`speculators_data_link` writes such a directory (by default `<run>/speculators_data`) holding only
relative symlinks: nothing is copied or moved, so runs written before it existed keep their layout
and can get one later, and the links survive moving the whole run folder. Pure: no torch, no Django.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.contract.errors import InputError

log = logging.getLogger(__name__)

DATA_DIRNAME = "speculators_data"
HIDDEN_STATES_DIRNAME = "hidden_states"
DATASET_FILES = ("state.json", "dataset_info.json")


class SpeculatorsLayoutError(InputError):
    """The run's files cannot be linked into speculators' data directory."""


@dataclass(frozen=True)
class SpeculatorsData:
    data_dir: Path  # what to pass as `speculators train --data-path`
    draft_vocab_size: int  # N of the linked d2t-{N}.npy / t2d-{N}.npy (pass as --draft-vocab-size)
    linked: tuple[str, ...]  # the names in data_dir, each a link into the run


def default_data_dir(run_dir: Path) -> Path:
    return Path(run_dir) / DATA_DIRNAME


def _npy_rows(path: Path) -> int:
    try:
        return int(np.load(path, mmap_mode="r").shape[0])
    except FileNotFoundError:
        raise SpeculatorsLayoutError(f"{path}: vocab mapping file not found (run the vocab stage)") from None
    except (ValueError, OSError) as exc:
        raise SpeculatorsLayoutError(f"{path}: not a .npy array ({exc})") from None


def _link_plan(*, prepared_dir: Path, hidden_states_dir: Path, d2t_path: Path, t2d_path: Path) -> tuple[dict, int]:
    missing = [name for name in DATASET_FILES if not (prepared_dir / name).is_file()]
    if missing:
        raise SpeculatorsLayoutError(f"{prepared_dir}: not a datasets save_to_disk directory (no {', '.join(missing)})")
    if not hidden_states_dir.is_dir():
        raise SpeculatorsLayoutError(f"{hidden_states_dir}: hidden states folder not found (run the extract stage)")
    size = _npy_rows(d2t_path)
    _npy_rows(t2d_path)
    plan: dict[str, Path] = {}
    for entry in sorted(prepared_dir.iterdir()):
        # The dataset's own files and whatever prepare wrote beside them (token_freq.pt, its summary);
        # a hidden_states folder an upstream layout keeps there is replaced by the one given.
        if entry.is_file() and not entry.name.startswith("."):
            plan[entry.name] = entry
    plan[HIDDEN_STATES_DIRNAME] = hidden_states_dir
    plan[f"d2t-{size}.npy"] = d2t_path
    plan[f"t2d-{size}.npy"] = t2d_path
    return plan, size


def _only_links(directory: Path) -> bool:
    return all(entry.is_symlink() for entry in directory.iterdir())


def swap_in(staging: Path, out_dir: Path) -> None:
    """Put the folder written at `staging` in `out_dir`'s place, replacing what was there, so that a reader
    never sees half a directory (the old one is moved aside, then removed)."""
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(out_dir, old)
        os.replace(staging, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(staging, out_dir)


def speculators_data_link(*, prepared_dir: Path, hidden_states_dir: Path, d2t_path: Path, t2d_path: Path,
                          out_dir: Path) -> SpeculatorsData:
    """(Re)write out_dir as speculators' data directory: one relative link per file it reads.

    out_dir must be absent or a directory of links (an earlier call's); anything else in it is
    refused rather than deleted. The links are made in a sibling folder and swapped in, so a reader
    never sees half a directory."""
    prepared_dir, hidden_states_dir = Path(prepared_dir).resolve(), Path(hidden_states_dir).resolve()
    d2t_path, t2d_path, out_dir = Path(d2t_path).resolve(), Path(t2d_path).resolve(), Path(out_dir).absolute()
    if out_dir.exists() and not (out_dir.is_dir() and not out_dir.is_symlink() and _only_links(out_dir)):
        raise SpeculatorsLayoutError(f"{out_dir}: exists and holds more than links; choose another folder for "
                                     "speculators' data directory or remove it")
    plan, size = _link_plan(prepared_dir=prepared_dir, hidden_states_dir=hidden_states_dir, d2t_path=d2t_path,
                            t2d_path=t2d_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.staging"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    for name, target in plan.items():
        # Relative to out_dir (staging has the same parent, so the same text resolves the same way).
        (staging / name).symlink_to(os.path.relpath(target, out_dir), target_is_directory=target.is_dir())
    swap_in(staging, out_dir)
    return SpeculatorsData(data_dir=out_dir, draft_vocab_size=size, linked=tuple(sorted(plan)))


def run_data_link(*, run_dir: Path, prepared_dir: Path, hidden_states_dir: Path, d2t_path: Path,
                  t2d_path: Path) -> SpeculatorsData | None:
    """`<run>/speculators_data` for a run whose stages have all written their files, or None, said in
    the log, when they cannot be linked (an imported extraction in another layout, say): the link is a
    convenience for users, and a stage that makes it must not fail for it."""
    try:
        data = speculators_data_link(prepared_dir=prepared_dir, hidden_states_dir=hidden_states_dir,
                                     d2t_path=d2t_path, t2d_path=t2d_path, out_dir=default_data_dir(run_dir))
    except SpeculatorsLayoutError as exc:
        log.warning("no %s folder for speculators' trainer: %s", DATA_DIRNAME, exc)
        return None
    # The command itself is on the run's page and in its summary (speculators_train_command).
    log.info("%s links this run's files for speculators' trainer (%d entries, draft vocabulary %d)",
             DATA_DIRNAME, len(data.linked), data.draft_vocab_size)
    return data


def speculators_train_command(*, target_dir: Path, data_dir: Path, draft_vocab_size: int,
                              aux_layer_ids: list[int]) -> str:
    """The `speculators train` command line that trains a draft from a run's linked folder with
    speculators' own CLI (aux layers only: the launcher adds the target's last layer itself)."""
    return shlex.join(["speculators", "train", "--verifier-name-or-path", str(target_dir), "--data-path",
                       str(data_dir), "--draft-vocab-size", str(draft_vocab_size), "--target-layer-ids",
                       *[str(i) for i in aux_layer_ids], "--on-missing", "raise"])
