"""How the Transformers extraction groups the prepared rows into forward batches, and the rows' lengths it
groups them by. Torch-free and Django-free: the worker that plans a split extraction
(workers.orchestration.shard_runners._extract_spans) puts the shards' edges at these batches' edges without importing
torch and Transformers, which took it 3.6-7.1 s on the shared machine (docs/results.md); the extraction itself
(workers.stages.extract.with_transformers) plans with these same functions, so both see the same batches.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

# Padded tokens per forward. Measured on the shared 2-core CPU box, demo target, 260 rows:
# one row per forward took 94 s, 512-8192 padded tokens 9-15 s (per-call overhead dominates
# small rows). GPUs take wider batches; rows are length-sorted so padding stays small.
DEFAULT_BATCH_TOKENS = {"cpu": 2048, "cuda": 16384}
MAX_BATCH_ROWS = 64


def plan_forward_batches(lengths: list[int], batch_tokens: int, max_rows: int = MAX_BATCH_ROWS) -> list[list[int]]:
    """Row indices grouped by similar length so padded size B * max_len stays <= batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and ((len(current) + 1) * width > batch_tokens or len(current) >= max_rows):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def batch_token_budget(device_type: str, batch_tokens: int | None = None) -> int:
    """Padded tokens per forward: the caller's choice, else the measured default for the device's type
    ("cpu", "cuda": a torch.device's `.type`)."""
    return batch_tokens or DEFAULT_BATCH_TOKENS.get(device_type, 2048)


def open_prepared(prepared_dir: Path) -> tuple[Dataset, list[int]]:
    """(the prepared dataset, each row's token count), refusing empty rows and rows whose
    `seq_len` disagrees with their `input_ids` before any model is loaded."""
    from datasets import load_from_disk

    prepared_dir = Path(prepared_dir)
    try:
        data = load_from_disk(str(prepared_dir)).with_format(None)
    except FileNotFoundError:
        raise FileNotFoundError(f"{prepared_dir}: no prepared dataset (run the prepare stage first)") from None
    # save_to_disk flattens any indices mapping, so arrow row i is dataset row i.
    return data, _checked_lengths(data.data.table, prepared_dir)


def prepared_lengths(prepared_dir: Path) -> list[int]:
    """Each prepared row's token count, checked as open_prepared checks them, read from the dataset's arrow
    files with pyarrow alone: `datasets.load_from_disk` imports torch for the torch format the prepare stage
    saves (datasets.formatting.torch_formatter)."""
    import pyarrow as pa

    prepared_dir = Path(prepared_dir)
    try:
        state = json.loads((prepared_dir / "state.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{prepared_dir}: no prepared dataset (run the prepare stage first)") from None
    # The files save_to_disk wrote, in row order, each an arrow stream (what load_from_disk maps).
    tables = [pa.ipc.open_stream(pa.memory_map(str(prepared_dir / f["filename"]))).read_all()
              for f in state["_data_files"]]
    return _checked_lengths(pa.concat_tables(tables), prepared_dir)


def _checked_lengths(table, prepared_dir: Path) -> list[int]:
    import numpy as np
    import pyarrow.compute as pc

    if "input_ids" not in table.column_names:
        raise ValueError(f"{prepared_dir}: prepared dataset has no input_ids column ({table.column_names})")
    if table.num_rows == 0:
        raise ValueError(f"{prepared_dir}: prepared dataset has no rows")
    # Reading the memory-mapped columns with pyarrow builds no Python lists.
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
    declared = (np.asarray(table.column("seq_len").to_numpy(zero_copy_only=False))
                if "seq_len" in table.column_names else lengths)
    bad = np.flatnonzero((lengths == 0) | (lengths != declared))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{prepared_dir}: row {i} has seq_len {int(declared[i])} and {int(lengths[i])} input_ids; "
            "rows must be non-empty and agree (re-run the prepare stage)"
        )
    return lengths.tolist()
