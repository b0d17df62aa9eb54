"""The data directory speculators' trainer reads when it trains here: the run's rows in split order.

speculators 0.9 splits by position only (`train/data.py ArrowDataset`: rows [0, int(n * ratio)) train,
the rest validate, whatever the seed), so it validates on the file's tail, where a conversation can
straddle the boundary and prompts repeated from earlier rows land. To train on our split
(workers.stages.train.holdout.split) it gets a directory whose row p is prepared row order[p], train rows
first: the dataset rewritten in that order (token ids only: a fraction of a per-mille of the hidden
states' bytes), `hidden_states/hs_{p}.safetensors` a relative link to the extraction's
`hs_{order[p]}.safetensors`, and the draft vocabulary linked from the run's links folder
(workers.contract.extraction.speculators_layout), which stays as it was for users who point speculators at a run
themselves. `split_order.json` records the order; a folder without it is never replaced.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.extraction.speculators_layout import swap_in

ORDER_FILE = "split_order.json"
DATASET_ENTRIES = ("state.json", "dataset_info.json")  # with data-*.arrow: what save_to_disk writes
HIDDEN_STATES = "hidden_states"


class SplitDataError(InputError):
    """The split-ordered data directory cannot be written where it was asked."""


def split_data_dir(links_dir: Path) -> Path:
    """Beside the run's links folder: `speculators_data` -> `speculators_data_split`."""
    links_dir = Path(links_dir)
    return links_dir.with_name(links_dir.name + "_split")


def _is_dataset_file(name: str) -> bool:
    return name in DATASET_ENTRIES or (name.startswith("data-") and name.endswith(".arrow"))


def write_split_data(*, prepared_dir: Path, hidden_states_dir: Path | None, links_dir: Path, order: list[int],
                     out_dir: Path) -> Path:
    """(Re)write out_dir as speculators' `--data-path` with prepared row order[p] at position p.

    The other entries of `links_dir` (d2t/t2d, token_freq.pt) are linked as they are. Written in a
    sibling folder and swapped in, so a reader never sees half a directory. `hidden_states_dir` None
    (an online run) leaves `hidden_states/` empty: speculators then asks its vLLM endpoint for every
    sample (`--on-missing generate`) and deletes each file it was sent once read, so nothing
    accumulates there."""
    from datasets import load_from_disk

    prepared_dir = Path(prepared_dir).resolve()
    links_dir, out_dir = Path(links_dir).absolute(), Path(out_dir).absolute()
    if out_dir.exists() and not (out_dir / ORDER_FILE).is_file():
        raise SplitDataError(f"{out_dir}: exists and was not written by the train stage (no {ORDER_FILE}); "
                             "remove it or choose another folder for speculators' data")
    staging = out_dir.parent / f".{out_dir.name}.staging"
    if staging.exists():
        shutil.rmtree(staging)
    # save_to_disk writes the rows as the index mapping gives them and keeps the dataset's format (torch,
    # which speculators' reader relies on; see workers/stages/prepare/stage.py).
    load_from_disk(str(prepared_dir)).select(order).save_to_disk(str(staging))
    for entry in sorted(links_dir.iterdir()):
        if entry.name == HIDDEN_STATES or _is_dataset_file(entry.name) or entry.name.startswith("."):
            continue
        target = entry.resolve()
        (staging / entry.name).symlink_to(os.path.relpath(target, out_dir), target_is_directory=target.is_dir())
    hs_dir = staging / HIDDEN_STATES
    hs_dir.mkdir()
    if hidden_states_dir is not None:
        # Relative to out_dir/hidden_states: staging has the same depth.
        base = os.path.relpath(Path(hidden_states_dir).resolve(), out_dir / HIDDEN_STATES)
        for position, row in enumerate(order):
            (hs_dir / f"hs_{position}.safetensors").symlink_to(os.path.join(base, f"hs_{row}.safetensors"))
    (staging / ORDER_FILE).write_text(json.dumps({"order": [int(i) for i in order]}) + "\n")
    swap_in(staging, out_dir)
    return out_dir
