"""Extract stage: target hidden states for every prepared row, in speculators 0.9's layout.

Each row i of the prepared dataset becomes `out_dir/hidden_states/hs_{i}.safetensors` holding
`token_ids` (int64 [T]) and `hidden_states` (bf16 [T, L, H]), the file speculators' vLLM
connector writes and `hs_connectors.transfer.FileTransfer.get_cached` reads back with
`safetensors.torch.load_file`. `speculators.train.data.ArrowDataset._get_raw_data` then splits
it: `hidden_states[:, :-1]` (the aux layers, flattened to [T, (L-1)*H]) and
`hidden_states[:, -1]` as `verifier_last_hidden_states`, and requires `token_ids` to equal the
row's `input_ids`. The row index is the file index, so files keep the dataset's order.

Layer ids index Hugging Face `outputs.hidden_states`: id i < N is the input to decoder layer i.
The last id N is the final decoder layer's output BEFORE the model's final norm, because
`Eagle3DraftModel.forward` computes its targets as
`verifier_lm_head(verifier_norm(verifier_last_hidden_states))` with `verifier_norm` loaded from
the target's `model.norm.weight` (speculators `model.py`, `models/eagle3/core.py`); a post-norm
tensor would be normalised twice. transformers 5.x `capture_outputs` (tie_last_hidden_states)
replaces `hidden_states[N]` with the post-norm `last_hidden_state`, so we do not take index N
from `output_hidden_states`. Instead forward pre-hooks read each wanted tensor directly: the
input of decoder layer i for i < N and the input of the final norm for N. That gives the same
tensors as `output_hidden_states` for i < N (tests check it) while holding only L tensors, not
N+1, and skips the lm_head (logits would be [B, T, vocab] in fp32).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import closing
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from workers.stages.device import device_label, resolve_device  # noqa: E402,F401
from workers.contract.dtypes import floor_bytes_per_token  # noqa: E402
from workers.stages.extract.files import HiddenBatch, _check_batch, _write_batch, _writer  # noqa: E402,F401
from workers.stages.extract.model import (  # noqa: E402,F401
    LayerCapture,
    decoder_parts,
    load_target,
    place_target,
    spread_device,
)
from workers.stages.extract.resume import (  # noqa: E402
    extraction_fingerprint,
    resume_or_start,
    write_json_atomic,
)
from workers.contract.progress import ProgressFn  # noqa: E402
from workers.contract.target import read_target_config, validate_layer_ids  # noqa: E402

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)


HIDDEN_STATES_DIRNAME = "hidden_states"
FILE_PATTERN = "hidden_states/hs_{idx}.safetensors"
MANIFEST_NAME = "data_config.json"
STORE_DTYPE = torch.bfloat16
# Padded tokens per forward. Measured on the shared 2-core CPU box, demo target, 260 rows:
# one row per forward took 94 s, 512-8192 padded tokens 9-15 s (per-call overhead dominates
# small rows). GPUs take wider batches; rows are length-sorted so padding stays small.
DEFAULT_BATCH_TOKENS = {"cpu": 2048, "cuda": 16384}
MAX_BATCH_ROWS = 64


@dataclass(frozen=True)
class ExtractionResult:
    out_dir: Path
    hidden_states_dir: Path
    manifest_path: Path
    num_samples: int
    total_tokens: int
    layer_ids: list[int]
    hidden_size: int
    num_layers_captured: int
    dtype: str
    model_load_seconds: float
    forward_seconds: float
    total_time_seconds: float
    tokens_per_second: float
    bytes_on_disk: int
    bytes_per_token: float
    floor_bytes_per_token: int
    device: str  # where the forwards ran, e.g. "cpu" or "cuda:0 (NVIDIA H200)"
    # A resumed attempt keeps the samples an earlier one wrote whole: num_samples and total_tokens
    # count every sample; the timings and tokens_per_second only what this attempt extracted.
    num_samples_reused: int = 0
    num_samples_extracted: int = 0
    tokens_extracted: int = 0

    def as_dict(self) -> dict:
        d = asdict(self)
        for key in ("out_dir", "hidden_states_dir", "manifest_path"):
            d[key] = str(d[key])
        return d


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


def batch_token_budget(device: torch.device, batch_tokens: int | None = None) -> int:
    """Padded tokens per forward: the caller's choice, else the measured default for the device."""
    return batch_tokens or DEFAULT_BATCH_TOKENS.get(device.type, 2048)


def _pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = 1
    return ids.to(device), mask.to(device)


def open_prepared(prepared_dir: Path) -> tuple[Dataset, list[int]]:
    """(the prepared dataset, each row's token count), refusing empty rows and rows whose
    `seq_len` disagrees with their `input_ids` before any model is loaded."""
    import numpy as np
    import pyarrow.compute as pc
    from datasets import load_from_disk

    prepared_dir = Path(prepared_dir)
    try:
        data = load_from_disk(str(prepared_dir)).with_format(None)
    except FileNotFoundError:
        raise FileNotFoundError(f"{prepared_dir}: no prepared dataset (run the prepare stage first)") from None
    if "input_ids" not in data.column_names:
        raise ValueError(f"{prepared_dir}: prepared dataset has no input_ids column ({data.column_names})")
    if len(data) == 0:
        raise ValueError(f"{prepared_dir}: prepared dataset has no rows")
    # save_to_disk flattens any indices mapping, so arrow row i is dataset row i; reading the
    # memory-mapped columns with pyarrow builds no Python lists.
    table = data.data.table
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
    declared = (np.asarray(table.column("seq_len").to_numpy(zero_copy_only=False))
                if "seq_len" in data.column_names else lengths)
    bad = np.flatnonzero((lengths == 0) | (lengths != declared))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{prepared_dir}: row {i} has seq_len {int(declared[i])} and {int(lengths[i])} input_ids; "
            "rows must be non-empty and agree (re-run the prepare stage)"
        )
    return data, lengths.tolist()


def iter_hidden_states(model, data, lengths: list[int], batch_tokens: int, layer_ids: list[int],
                       device: torch.device, only: list[int] | None = None) -> Iterator[HiddenBatch]:
    """The captured layers for every row (or the rows in `only`), batch by batch in plan_forward_batches' order.

    extract()'s forwards without its checks, files or progress: the benchmark's bare loop drives
    this same generator, so the two differ only by the stage's own work.
    """
    base, _, _ = decoder_parts(model)
    pad_id = model.config.pad_token_id if isinstance(model.config.pad_token_id, int) else 0
    input_ids = data.data.table.column("input_ids")
    capture = LayerCapture(model, layer_ids)
    todo = list(range(len(lengths))) if only is None else only
    try:
        for planned in plan_forward_batches([lengths[i] for i in todo], batch_tokens):
            batch = [todo[j] for j in planned]
            # One arrow gather per batch: data[i] per row would build a dict of every column.
            rows = input_ids.take(batch).to_pylist()
            ids, mask = _pad(rows, pad_id, device)
            t0 = time.perf_counter()
            # Scoped to the forward: an inference_mode held across `yield` would leak into the caller.
            with torch.inference_mode():
                base(input_ids=ids, attention_mask=mask, use_cache=False)
                hidden = capture.stacked().to(STORE_DTYPE).cpu()
            yield HiddenBatch(batch, rows, hidden, time.perf_counter() - t0)
    finally:
        capture.remove()


def _prepared_max_seq_len(prepared_dir: Path, lengths: list[int]) -> int:
    summary = prepared_dir / "prepare_summary.json"
    try:
        return int(json.loads(summary.read_text())["max_seq_len"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return max(lengths)


def write_manifest(*, out_dir: Path, hs_dir: Path, target_dir: Path, prepared_dir: Path, lengths: list[int],
                   layer_ids: list[int], hidden_size: int, dtype: str, tp_size: int, started: float,
                   model_load_seconds: float, forward_seconds: float, reused, tokens_extracted: int,
                   bytes_on_disk: int, device: str, extra: dict | None = None) -> ExtractionResult:
    """data_config.json for a finished extraction (either backend), written last and whole (temp +
    rename: a manifest on disk means every file it counts is complete), and the result it describes.

    `reused` is extract_resume.ReusedSamples: the samples an earlier attempt left whole; the timings
    and tokens per second are this attempt's."""
    num_rows, num_layers = len(lengths), len(layer_ids)
    total_tokens = reused.tokens + tokens_extracted
    total_time = time.perf_counter() - started
    tps = tokens_extracted / forward_seconds if forward_seconds > 0 else 0.0
    manifest = {
        "model_path": str(target_dir),
        "layer_ids": layer_ids,
        "max_seq_len": _prepared_max_seq_len(prepared_dir, lengths),
        "tp_size": tp_size,
        "total_samples": num_rows,
        "total_tokens": total_tokens,
        "total_time_seconds": round(total_time, 3),
        "data_format_version": 1,
        "hidden_size": hidden_size,
        "num_layers_captured": num_layers,
        "dtype": dtype,
        "layer_id_convention": "hf_hidden_states_index",
        "last_layer": "pre_final_norm",
        "file_pattern": FILE_PATTERN,
        "prepared_path": str(prepared_dir),
        "model_load_seconds": round(model_load_seconds, 3),
        "forward_seconds": round(forward_seconds, 3),
        "tokens_per_second": round(tps, 1),
        "samples_reused": len(reused.indices),
        "tokens_extracted": tokens_extracted,
        "device": device,
        "bytes_on_disk": bytes_on_disk,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    manifest_path = out_dir / MANIFEST_NAME
    write_json_atomic(manifest_path, manifest)
    return ExtractionResult(
        out_dir=out_dir, hidden_states_dir=hs_dir, manifest_path=manifest_path, num_samples=num_rows,
        total_tokens=total_tokens, layer_ids=layer_ids, hidden_size=hidden_size, num_layers_captured=num_layers,
        dtype=dtype, model_load_seconds=model_load_seconds, forward_seconds=forward_seconds,
        total_time_seconds=total_time, tokens_per_second=tps, bytes_on_disk=bytes_on_disk,
        bytes_per_token=bytes_on_disk / total_tokens,
        floor_bytes_per_token=floor_bytes_per_token(num_layers, hidden_size, dtype), device=device,
        num_samples_reused=len(reused.indices), num_samples_extracted=num_rows - len(reused.indices),
        tokens_extracted=tokens_extracted,
    )


def extract(
    *,
    target_dir: Path,
    prepared_dir: Path,
    out_dir: Path,
    layer_ids: list[int],
    device: str = "auto",
    num_gpus: int = 1,
    batch_tokens: int | None = None,
    on_progress: ProgressFn | None = None,
) -> ExtractionResult:
    """Run the target over every prepared row and write hidden states plus data_config.json.

    num_gpus > 1 spreads the target over that many GPUs (load_target); `device` is then ignored.

    out_dir must be absent, empty, or an earlier attempt of this same extraction (see
    workers.stages.extract.resume): then the samples it wrote whole are kept, not extracted again."""
    import pyarrow.compute as pc

    started = time.perf_counter()
    target_dir, prepared_dir, out_dir = Path(target_dir), Path(prepared_dir), Path(out_dir)
    target = read_target_config(target_dir)
    layer_ids = validate_layer_ids(list(layer_ids), target.num_layers)
    data, lengths = open_prepared(prepared_dir)
    num_rows = len(lengths)
    input_ids = data.data.table.column("input_ids")
    max_id = pc.max(pc.list_flatten(input_ids)).as_py()
    if max_id is not None and max_id >= target.vocab_size:
        raise ValueError(
            f"{prepared_dir}: token id {max_id} is outside the target's vocabulary "
            f"({target.vocab_size}); was it prepared with another tokenizer?"
        )
    store_dtype = str(STORE_DTYPE).removeprefix("torch.")
    fingerprint = extraction_fingerprint(target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                                         dtype=store_dtype, num_rows=num_rows)
    hs_dir, reused, resumable = resume_or_start(
        out_dir=out_dir, fingerprint=fingerprint, hs_dirname=HIDDEN_STATES_DIRNAME, manifest_name=MANIFEST_NAME,
        input_ids=input_ids, num_layers=len(layer_ids), hidden_size=target.hidden_size)
    kept = set(reused.indices)
    todo = [i for i in range(num_rows) if i not in kept]
    if resumable:
        log.info("resuming %s: %d of %d samples already written whole are kept, %d incomplete redone",
                 out_dir, len(kept), num_rows, reused.redone)

    dev, where = place_target(num_gpus, device)
    forward_seconds, model_load_seconds = 0.0, 0.0
    bytes_on_disk, extracted_tokens, done = reused.nbytes, 0, len(kept)
    step = max(1, num_rows // 100)
    if on_progress is not None and done:
        on_progress(done, num_rows)

    def settle(batch: HiddenBatch, write: Future) -> None:
        nonlocal bytes_on_disk, extracted_tokens, done
        bytes_on_disk += write.result()
        extracted_tokens += sum(len(row) for row in batch.rows)
        prev, done = done, done + len(batch.indices)
        if on_progress is not None and (done // step != prev // step or done == num_rows):
            on_progress(done, num_rows)

    if todo:  # a resumed extraction with nothing left to do never loads the model
        t0 = time.perf_counter()
        model = load_target(target_dir, dev, num_gpus)
        model_load_seconds = time.perf_counter() - t0
        _, layers, _ = decoder_parts(model)
        if len(layers) != target.num_layers:
            raise ValueError(f"{target_dir}: config says {target.num_layers} layers, model has {len(layers)}")
        budget = batch_token_budget(dev, batch_tokens)
        # closing(): a failed write must still take the hooks off the model. Batch k is written after
        # batch k+1 has been computed, so that a background writer overlaps the two.
        with (
            closing(iter_hidden_states(model, data, lengths, budget, layer_ids, dev, only=todo)) as batches,
            _writer(dev) as writer,
        ):
            pending: tuple[HiddenBatch, Future] | None = None
            for batch in batches:
                forward_seconds += batch.forward_seconds
                _check_batch(batch)
                if pending is not None:
                    settle(*pending)
                pending = (batch, writer.submit(_write_batch, hs_dir, batch))
            settle(*pending)
        del model, layers, batch, pending
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    result = write_manifest(
        out_dir=out_dir, hs_dir=hs_dir, target_dir=target_dir, prepared_dir=prepared_dir, lengths=lengths,
        layer_ids=layer_ids, hidden_size=target.hidden_size, dtype=store_dtype, tp_size=1, started=started,
        model_load_seconds=model_load_seconds, forward_seconds=forward_seconds, reused=reused,
        tokens_extracted=extracted_tokens, bytes_on_disk=bytes_on_disk, device=where)
    if result.bytes_per_token > result.floor_bytes_per_token * 1.10:
        log.warning("%.0f bytes per token on disk, floor %d: many tiny rows?", result.bytes_per_token,
                    result.floor_bytes_per_token)
    log.info(
        "extracted %d rows (%d kept from an earlier attempt), %d tokens, layers %s in %.1f s (%.0f tok/s on %s)",
        num_rows - len(kept), len(kept), extracted_tokens, layer_ids, result.total_time_seconds,
        result.tokens_per_second, where,
    )
    return result
