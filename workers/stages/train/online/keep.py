""""Keep the cache": an online run's cache turned into an ordinary extraction, registered and reused as one.

Only a whole cache becomes one: every prepared row must have its hs_{i}.safetensors in the cache, whole by
the checks a resumed extraction applies (workers.stages.extract.resume.sample_is_whole: its header's
names, dtypes and shapes for the row's token count, the file's size, and token ids equal to the row's).
A cache that lacks rows (evicted, never asked for) is refused with the count and nothing is written. The
files are hard-linked where the cache and the extraction share a filesystem (no copy; the cache's later
evictions leave the extraction's names in place), copied otherwise; data_config.json is written last
(workers.stages.extract.output.result.write_manifest), so a folder with a manifest is complete.

Pure: no torch, no Django (the files are checked by their headers, as the extraction's verification does).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.extraction.verify import prepared_input_ids
from workers.stages.extract.resume import ReusedSamples, sample_is_whole
from workers.stages.extract.output.result import HIDDEN_STATES_DIRNAME, MANIFEST_NAME, ExtractionResult, write_manifest

SERVED_NAME = "served.json"  # which capture server produced each cached sample (the online cache's record)
STORE_DTYPE = "bfloat16"  # what capture servers and both extraction backends store
SHOWN_ROWS = 10  # rows named in a refusal; the count says the rest


class CacheIncomplete(InputError):
    """The cache does not hold every prepared row whole; the message says how many are missing."""


def _place(source: Path, destination: Path) -> None:
    """A hard link where the filesystem allows one (no bytes copied), else a copy."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def cache_rows_missing(*, cache_dir: Path, token_ids: list[list[int]], num_layers: int,
                       hidden_size: int) -> list[int]:
    """The prepared rows whose sample the cache does not hold whole (absent, cut short, or another row's)."""
    return [i for i, ids in enumerate(token_ids)
            if not sample_is_whole(Path(cache_dir) / f"hs_{i}.safetensors", token_ids=ids, num_layers=num_layers,
                                   hidden_size=hidden_size)]


def keep_cache_as_extraction(*, cache_dir: Path, target_dir: Path, prepared_dir: Path, out_dir: Path,
                             layer_ids: list[int], hidden_size: int) -> ExtractionResult:
    """Write `out_dir` as an extraction (hidden_states/hs_{i}.safetensors and data_config.json) from the
    cache's files. Refused (CacheIncomplete, nothing written) unless every prepared row is there whole;
    refused too when out_dir already holds files (a kept extraction is never overwritten)."""
    started = time.perf_counter()
    cache_dir, prepared_dir, out_dir = Path(cache_dir), Path(prepared_dir), Path(out_dir)
    if not cache_dir.is_dir():
        raise CacheIncomplete(f"{cache_dir}: no hidden-state cache there (the online run cached nothing, or it "
                              "was removed)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise InputError(f"{out_dir} holds files already: a kept extraction is written into an empty folder")
    token_ids = prepared_input_ids(prepared_dir)
    if not token_ids:
        raise InputError(f"{prepared_dir}: the prepared dataset has no rows")
    missing = cache_rows_missing(cache_dir=cache_dir, token_ids=token_ids, num_layers=len(layer_ids),
                                 hidden_size=hidden_size)
    if missing:
        shown = ", ".join(str(i) for i in missing[:SHOWN_ROWS]) + (", ..." if len(missing) > SHOWN_ROWS else "")
        raise CacheIncomplete(
            f"the cache holds {len(token_ids) - len(missing)} of {len(token_ids)} prepared rows whole: "
            f"{len(missing)} missing (rows {shown}); a cache smaller than the data evicts samples, so only a run "
            f"whose cache held every row can be kept")
    # Written beside out_dir and renamed into place: a folder under out_dir's name is whole or absent.
    staging = out_dir.with_name(out_dir.name + ".keeping")
    if staging.exists():
        shutil.rmtree(staging)  # what an interrupted attempt left
    hs_dir = staging / HIDDEN_STATES_DIRNAME
    hs_dir.mkdir(parents=True)
    nbytes = 0
    for i in range(len(token_ids)):
        destination = hs_dir / f"hs_{i}.safetensors"
        _place(cache_dir / destination.name, destination)
        nbytes += destination.stat().st_size
    served = _served(cache_dir)
    if served is not None:
        (staging / SERVED_NAME).write_text(json.dumps(served, indent=1))
    lengths = [len(ids) for ids in token_ids]
    tokens = sum(lengths)
    extra = {"source": "online capture: kept from the run's hidden-state cache", "kept_from": str(cache_dir)}
    written = write_manifest(
        out_dir=staging, hs_dir=hs_dir, target_dir=Path(target_dir), prepared_dir=prepared_dir, lengths=lengths,
        layer_ids=list(layer_ids), hidden_size=hidden_size, dtype=STORE_DTYPE, tp_size=1, started=started,
        model_load_seconds=0.0, forward_seconds=0.0,
        reused=ReusedSamples(indices=list(range(len(lengths))), tokens=tokens, nbytes=nbytes, redone=0),
        tokens_extracted=0, bytes_on_disk=nbytes, device="capture servers (online)", extra=extra)
    if out_dir.exists():
        out_dir.rmdir()  # empty, checked above
    staging.rename(out_dir)
    return replace(written, out_dir=out_dir, hidden_states_dir=out_dir / HIDDEN_STATES_DIRNAME,
                   manifest_path=out_dir / MANIFEST_NAME)


def _served(cache_dir: Path) -> dict | None:
    """The cache's record of which server produced each sample, when it has a readable one."""
    try:
        return json.loads((cache_dir / SERVED_NAME).read_text())
    except (OSError, ValueError):
        return None
