"""Resuming an extraction: which samples an earlier attempt already wrote whole.

Pure (no torch, no Django). An extraction directory records what it is being made from in
`resume.json` (target, prepared rows, layer ids, stored dtype), written before the first sample.
A later attempt with the same record keeps every `hs_{i}.safetensors` whose header says it is
complete for row i: exactly `token_ids` (I64 [T]) and `hidden_states` (BF16 [T, L, H]) with T the
row's token count, data that ends where the file ends (`read_safetensors_header` checks the size),
and token ids equal to the row's. Anything else (a truncated or foreign file, a stray temp file)
is removed and extracted again. A different record means the inputs changed (prepare ran again,
other layers): the directory's own files go and the extraction starts over.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from workers.contract.extraction.tensor_headers import HeaderError, read_safetensors_header, read_safetensors_ints

RESUME_NAME = "resume.json"
RESUME_FORMAT = 1
SAMPLE_FILE = re.compile(r"^hs_(\d+)\.safetensors$")
TEMP_FILE = re.compile(r"^hs_\d+\.safetensors\.tmp$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
ID_CHUNK = 1024  # rows whose token ids are read from arrow at once


def files_signature(directory: Path, suffixes: tuple[str, ...] | None = None) -> list[list]:
    """[name, size, mtime_ns] of the directory's files: a rewrite (prepare run again, new weights)
    changes them, and reading them costs a stat per file, not a read of gigabytes."""
    rows = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file() and (suffixes is None or entry.name.endswith(suffixes)):
            st = entry.stat()
            rows.append([entry.name, st.st_size, st.st_mtime_ns])
    return rows


def extraction_fingerprint(*, target_dir: Path, prepared_dir: Path, layer_ids: list[int], dtype: str,
                           num_rows: int) -> dict:
    """What an extraction is made from; equal fingerprints mean an earlier attempt's files fit."""
    target_dir, prepared_dir = Path(target_dir).resolve(), Path(prepared_dir).resolve()
    return {
        "format": RESUME_FORMAT,
        "target_path": str(target_dir),
        "target_config_sha256": hashlib.sha256((target_dir / "config.json").read_bytes()).hexdigest(),
        "target_weights": files_signature(target_dir, WEIGHT_SUFFIXES),
        "prepared_path": str(prepared_dir),
        "prepared_files": files_signature(prepared_dir),
        "num_rows": num_rows,
        "layer_ids": list(layer_ids),
        "dtype": dtype,
    }


def _read_record(out_dir: Path) -> dict | None:
    """The directory's record; None without one, {} for one that cannot be read (still ours: it
    matches no fingerprint, so the directory is cleared of its extraction files and starts over)."""
    try:
        record = json.loads((out_dir / RESUME_NAME).read_text())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def write_json_atomic(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def _clear_own_files(out_dir: Path, hs_dirname: str, manifest_name: str) -> None:
    """Only what an extraction writes goes; a file of anyone else's stays where it is."""
    hs_dir = out_dir / hs_dirname
    if hs_dir.is_dir():
        for entry in os.scandir(hs_dir):
            if SAMPLE_FILE.match(entry.name) or TEMP_FILE.match(entry.name):
                os.unlink(entry.path)
    for name in (manifest_name, RESUME_NAME, RESUME_NAME + ".tmp", manifest_name + ".tmp"):
        (out_dir / name).unlink(missing_ok=True)


def open_for_resume(*, out_dir: Path, fingerprint: dict, hs_dirname: str, manifest_name: str) -> bool:
    """Make out_dir ready for this extraction; True when an earlier attempt's samples may be reused.

    An empty or absent directory starts fresh. A directory holding our record for the same inputs
    resumes; for other inputs it is cleared of the extraction's own files. A non-empty directory
    without a record is someone else's and is refused."""
    out_dir = Path(out_dir)
    record = _read_record(out_dir)
    if record is None and out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir}: output directory is not empty; choose a new one")
    resumable = record == fingerprint
    if record is not None and not resumable:
        _clear_own_files(out_dir, hs_dirname, manifest_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not resumable:
        write_json_atomic(out_dir / RESUME_NAME, fingerprint)  # before any sample: the dir says what it holds
    (out_dir / manifest_name).unlink(missing_ok=True)  # a manifest means "complete"; this attempt rewrites it
    return resumable


def sample_is_whole(path: Path, *, token_ids: list[int], num_layers: int, hidden_size: int) -> bool:
    """True when the file is the complete sample of a row with these token ids, by its header."""
    try:
        header = read_safetensors_header(path)
    except (OSError, HeaderError):
        return False
    tensors = header.tensors
    if set(tensors) != {"token_ids", "hidden_states"}:
        return False
    ids, hidden = tensors["token_ids"], tensors["hidden_states"]
    tokens = len(token_ids)
    if (ids.dtype, ids.shape) != ("I64", (tokens,)):
        return False
    if (hidden.dtype, hidden.shape) != ("BF16", (tokens, num_layers, hidden_size)):
        return False
    try:
        return read_safetensors_ints(path, header, "token_ids") == token_ids
    except OSError:
        return False


@dataclass(frozen=True)
class ReusedSamples:
    indices: list[int]  # rows whose files are kept, ascending
    tokens: int
    nbytes: int
    redone: int  # files found incomplete or not matching their row, removed to be written again


def reusable_samples(*, hs_dir: Path, input_ids, num_layers: int, hidden_size: int) -> ReusedSamples:
    """Check every sample file an earlier attempt left; remove those that are not whole.

    `input_ids` is the prepared rows' arrow column (list<int>), read in chunks of the rows that
    have a file."""
    present: dict[int, Path] = {}
    if hs_dir.is_dir():
        for entry in os.scandir(hs_dir):
            if TEMP_FILE.match(entry.name):
                os.unlink(entry.path)  # a write a kill interrupted before its rename
            elif (m := SAMPLE_FILE.match(entry.name)) and int(m.group(1)) < len(input_ids):
                present[int(m.group(1))] = Path(entry.path)
    kept, tokens, nbytes, redone = [], 0, 0, 0
    indices = sorted(present)
    for start in range(0, len(indices), ID_CHUNK):
        chunk = indices[start:start + ID_CHUNK]
        for i, ids in zip(chunk, input_ids.take(chunk).to_pylist()):
            path = present[i]
            if sample_is_whole(path, token_ids=ids, num_layers=num_layers, hidden_size=hidden_size):
                kept.append(i)
                tokens += len(ids)
                nbytes += path.stat().st_size
            else:
                path.unlink()
                redone += 1
    return ReusedSamples(indices=kept, tokens=tokens, nbytes=nbytes, redone=redone)


def resume_or_start(*, out_dir: Path, fingerprint: dict, hs_dirname: str, manifest_name: str, input_ids,
                    num_layers: int, hidden_size: int) -> tuple[Path, ReusedSamples, bool]:
    """Open out_dir for an extraction (either backend): its hidden-states folder, the samples an earlier
    attempt of the same extraction left whole (none when it starts afresh), and whether it resumes."""
    resumable = open_for_resume(out_dir=out_dir, fingerprint=fingerprint, hs_dirname=hs_dirname,
                                manifest_name=manifest_name)
    hs_dir = out_dir / hs_dirname
    hs_dir.mkdir(parents=True, exist_ok=True)
    reused = (reusable_samples(hs_dir=hs_dir, input_ids=input_ids, num_layers=num_layers, hidden_size=hidden_size)
              if resumable else ReusedSamples(indices=[], tokens=0, nbytes=0, redone=0))
    return hs_dir, reused, resumable
