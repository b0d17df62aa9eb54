"""What an extraction leaves behind, whichever backend made it: data_config.json (written last, whole)
and the ExtractionResult it describes.

Split from workers.stages.extract.with_transformers to keep each module readable.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from workers.contract.extraction.dtypes import floor_bytes_per_token
from workers.stages.extract.resume import write_json_atomic

HIDDEN_STATES_DIRNAME = "hidden_states"
FILE_PATTERN = "hidden_states/hs_{idx}.safetensors"
MANIFEST_NAME = "data_config.json"


@dataclass(frozen=True)
class ExtractionResult:
    """What an extraction wrote and how long it took.

    `forward_seconds` is the forward loop's time: from the first batch's arrow gather and padding to
    the last batch's forward and device-to-host copy being done, less `write_wait` (the time the loop
    stood still for file writes: writing them itself on the synchronous path, or blocked on a full
    writer on the overlapped one, measured only once the device had finished what was launched).
    It includes the forwards, the captured layers' stacking and cast, whatever part of the copies
    did not overlap a forward, and the progress callbacks; not the model load, the files the writer
    was still writing when the loop ended (`drain`), the checks before it or the manifest.
    `tokens_per_second` = tokens_extracted / forward_seconds (the vLLM backend: its requests' wall clock).

    `time_split_s` says where the time went (seconds; empty from the vLLM backend):
    - model_load: loading the target (= model_load_seconds);
    - forward_loop: = forward_seconds;
    - forward: in the forwards themselves: device time between CUDA events around each (stacking
      and cast included), on the CPU the wall time of each;
    - copies: device time of the device-to-host copies (CUDA events; overlapped with the next
      forward on the overlapped path), 0 on the CPU where the states already are in host memory;
    - writes: checking the batches and writing their files, on whichever thread wrote them;
    - write_wait: the loop held up by file writes (see above; on the synchronous path = writes);
    - drain: after the loop, waiting for the writer to finish the last batches.
    """

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
    time_split_s: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        for key in ("out_dir", "hidden_states_dir", "manifest_path"):
            d[key] = str(d[key])
        return d


def _prepared_max_seq_len(prepared_dir: Path, lengths: list[int]) -> int:
    summary = prepared_dir / "prepare_summary.json"
    try:
        return int(json.loads(summary.read_text())["max_seq_len"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return max(lengths)


def write_manifest(*, out_dir: Path, hs_dir: Path, target_dir: Path, prepared_dir: Path, lengths: list[int],
                   layer_ids: list[int], hidden_size: int, dtype: str, tp_size: int, started: float,
                   model_load_seconds: float, forward_seconds: float, reused, tokens_extracted: int,
                   bytes_on_disk: int, device: str, extra: dict | None = None,
                   time_split: dict[str, float] | None = None) -> ExtractionResult:
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
        "time_split_s": {k: round(v, 3) for k, v in (time_split or {}).items()},  # {}: not measured by this backend
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
        tokens_extracted=tokens_extracted, time_split_s=dict(time_split or {}),
    )
