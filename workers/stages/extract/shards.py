"""An extraction split into shards (issue 36), whichever backend: where each shard's rows are, what a shard
returns, and the merge that makes the one extraction a single worker would have written. Pure (no torch,
no Django).

A shard `rows` is a span of positions in the order one worker extracts the rows: for Transformers the
forward batches' order (workers.stages.extract.batch_plan.plan_forward_batches, longest rows
first), with span edges moved to batch edges (`batch_spans`), so that every batch one worker would run is
run whole by one shard: a row's hidden states depend on the rows padded beside it, and only the same
batches give the same bytes. For vLLM, whose requests are one row each, the prepared rows' order.

Each shard writes `hs_{i}.safetensors` for its rows into a folder of its own (workers.stages.shards.shard_dir),
with its own resume record (a retried shard keeps what it wrote whole). `extract_merge` renames every
shard's files into the stage's `hidden_states/` (one rename per file, no copy), checks that every row is
there once, writes the stage's resume record and ONE data_config.json, and removes the shard folders.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workers.stages.extract.resume import (
    RESUME_NAME,
    SAMPLE_FILE,
    ReusedSamples,
    extraction_fingerprint,
    open_for_resume,
    write_json_atomic,
)
from workers.stages.extract.output.result import HIDDEN_STATES_DIRNAME, MANIFEST_NAME, ExtractionResult, write_manifest


@dataclass(frozen=True)
class ExtractionShard:
    """What one shard of an extraction wrote (stored as the shard row's result JSON)."""

    row_start: int
    row_stop: int
    out_dir: str
    num_samples: int
    samples_reused: int
    tokens_reused: int
    tokens_extracted: int
    bytes_on_disk: int
    model_load_seconds: float
    forward_seconds: float
    total_seconds: float
    device: str
    time_split_s: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def batch_spans(batches: list[list[int]], shards: int, weights: list[float] | None = None) -> list[range]:
    """Spans of positions in the batches' order (the rows of `batches`, flattened), each beginning at a batch
    edge. `weights`: each batch's work (padded_tokens: what its forward costs); the edges are those nearest to
    an even split of the work, so that shards end together. Without weights, of the rows. Fewer spans than
    asked when there are fewer batches (or two even edges fall nearest to one batch edge)."""
    weights = [float(len(b)) for b in batches] if weights is None else [float(w) for w in weights]
    if len(weights) != len(batches):
        raise ValueError(f"{len(weights)} weights for {len(batches)} batches")
    total_rows, total_work = sum(len(b) for b in batches), sum(weights)
    starts, position, done = [], 0, 0.0  # (row position, work before it) at each batch's start
    for batch, weight in zip(batches, weights):
        starts.append((position, done))
        position, done = position + len(batch), done + weight
    edges: list[int] = []
    for k in range(1, shards):
        even = total_work * k / shards
        # the batch edge nearest to the even split of the work (the lower one on a tie)
        edge = min(starts[1:], key=lambda s: (abs(s[1] - even), s[0]), default=(0, 0.0))[0]
        if edge > (edges[-1] if edges else 0):
            edges.append(edge)
    bounds = [0, *edges, total_rows]
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


# A row's own file costs about what the forward of this many padded tokens does (demo target, one CPU thread:
# writes 0.9-3.5 s and forwards 8.6-21.6 s for 1,600 rows and 65,154 padded tokens, i.e. 4-7 tokens a row).
WRITE_TOKENS_PER_ROW = 5
# A forward's time per padded token grows with its rows' length (attention is quadratic in it): fitted over the
# 35 forwards of 1,600 demo rows (hidden 128, one CPU thread), t = 7.4e-5 s x B L (1 + L / 144) + 0.013 s, so
# the length at which it doubles is about 1.1 x the hidden size.
ATTENTION_LENGTH_PER_HIDDEN = 1.1


def batch_work(batches: list[list[int]], lengths: list[int], hidden_size: int) -> list[float]:
    """Each batch's work in padded tokens: rows x its longest row, the longer rows weighing more (attention),
    plus its rows' files."""
    work = []
    for batch in batches:
        width = max(lengths[i] for i in batch)
        work.append(len(batch) * (width * (1 + width / (ATTENTION_LENGTH_PER_HIDDEN * hidden_size))
                                  + WRITE_TOKENS_PER_ROW))
    return work


def shard_fingerprint(fingerprint: dict, rows: range) -> dict:
    """A shard folder's resume record: the extraction's, and which positions the shard holds."""
    return {**fingerprint, "shard_rows": [rows.start, rows.stop]}


def _sample_files(hs_dir: Path) -> dict[int, Path]:
    found = {}
    if hs_dir.is_dir():
        for entry in os.scandir(hs_dir):
            if m := SAMPLE_FILE.match(entry.name):
                found[int(m.group(1))] = Path(entry.path)
    return found


def extract_merge(*, target_dir: Path, prepared_dir: Path, out_dir: Path, layer_ids: list[int], hidden_size: int,
                  lengths: list[int], dtype: str, shards: list[dict], tp_size: int = 1,
                  extra: dict | None = None) -> ExtractionResult:
    """Put the shards' files (`shards`: their ExtractionShard dicts, in index order) into `out_dir` as one
    extraction, with its manifest. The manifest's timings are the shards' (model load and forward loop:
    the longest shard's, as they ran at once; time_split_s: summed over shards, plus `merge`)."""
    merge_started = time.perf_counter()
    # The manifest's total time: the longest shard's (they ran at once) and this merge.
    started = merge_started - max((s.get("total_seconds", 0.0) for s in shards), default=0.0)
    target_dir, prepared_dir, out_dir = Path(target_dir), Path(prepared_dir), Path(out_dir)
    num_rows = len(lengths)
    fingerprint = extraction_fingerprint(target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                                         dtype=dtype, num_rows=num_rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / RESUME_NAME).exists():  # the stage folder holds only its shards' folders so far
        write_json_atomic(out_dir / RESUME_NAME, fingerprint)
    open_for_resume(out_dir=out_dir, fingerprint=fingerprint, hs_dirname=HIDDEN_STATES_DIRNAME,
                    manifest_name=MANIFEST_NAME)
    hs_dir = out_dir / HIDDEN_STATES_DIRNAME
    hs_dir.mkdir(exist_ok=True)
    for shard in shards:
        for index, path in sorted(_sample_files(Path(shard["out_dir"]) / HIDDEN_STATES_DIRNAME).items()):
            os.replace(path, hs_dir / path.name)  # the same file, renamed: its bytes, inode and mtime stay
    present = _sample_files(hs_dir)
    missing = [i for i in range(num_rows) if i not in present]
    if missing:
        raise FileNotFoundError(f"{hs_dir}: after merging {len(shards)} shards, {len(missing)} of {num_rows} rows "
                                f"have no sample (first: row {missing[0]}); retry the stage")
    nbytes = sum(present[i].stat().st_size for i in range(num_rows))
    split: dict[str, float] = {}
    for shard in shards:
        for key, value in (shard.get("time_split_s") or {}).items():
            split[key] = split.get(key, 0.0) + value
    shard_root = Path(shards[0]["out_dir"]).parent if shards else None
    if shard_root is not None and shard_root.parent == out_dir:
        shutil.rmtree(shard_root, ignore_errors=True)  # the shards' own folders: their samples moved out
    split["merge"] = time.perf_counter() - merge_started
    reused_count = sum(s["samples_reused"] for s in shards)
    reused = ReusedSamples(indices=list(range(reused_count)), tokens=sum(s["tokens_reused"] for s in shards),
                           nbytes=0, redone=0)  # only their count and tokens are written
    return write_manifest(
        out_dir=out_dir, hs_dir=hs_dir, target_dir=target_dir, prepared_dir=prepared_dir, lengths=lengths,
        layer_ids=layer_ids, hidden_size=hidden_size, dtype=dtype, tp_size=tp_size, started=started,
        model_load_seconds=max((s["model_load_seconds"] for s in shards), default=0.0),
        forward_seconds=max((s["forward_seconds"] for s in shards), default=0.0), reused=reused,
        tokens_extracted=sum(s["tokens_extracted"] for s in shards), bytes_on_disk=nbytes,
        device=shards[0]["device"] if shards else "", extra=extra, time_split=split)
