"""Verify a hidden-state extraction a user already has, in any of the layouts users bring.

Pure: no Django. A manifest is a claim, not a proof, so every claim is checked against the files.
Fast mode reads headers only: a safetensors header is checked the way the safetensors library
checks it (offsets cover every byte; speculators' `find_corrupt_hidden_state_indices` relies on the
same), a `.pt` archive's pickle is followed through an allowlist and its storages are sized. Full
mode also scans values for NaN/inf. Neither imports torch for safetensors files (the web tier runs
both: import from the browser, "Verify now"); a `.pt` file's values, and any `.pt` the header
reader cannot follow, go to torch.load(weights_only=True). Layouts and manifests: `layout`; one file:
`samples`; the byte formats: `tensor_headers` (all in this folder).
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workers.contract.extraction.dtypes import floor_bytes_per_token
from workers.contract.errors import InputError
from workers.contract.extraction.layout import (
    SAMPLE_RE,
    ManifestClaims,
    detect_layout,
    prepared_beside,
    read_manifest,
    resolve_layer_convention,
)
from workers.contract.extraction.samples import SampleInfo, read_sample
from workers.contract.progress import ProgressFn
from workers.contract.target import TargetConfig, default_layer_ids, read_target_config

log = logging.getLogger(__name__)

MAX_OFFENDERS = 10


@dataclass
class Check:
    name: str
    verdict: str  # "pass" | "fail" | "warn" | "skip"
    claimed: object
    measured: object
    message: str
    offending_files: list[str] = field(default_factory=list)


@dataclass
class VerificationReport:
    extraction_dir: Path
    layout: str
    claims: ManifestClaims
    target: TargetConfig | None
    full: bool
    checks: list[Check]
    num_files: int
    total_tokens: int
    bytes_on_disk: int
    bytes_per_token: float
    floor_bytes_per_token: int | None
    length_histogram: list[dict]
    seconds: float
    samples_per_s: float
    prepared_dir: Path | None = None  # the dataset the token ids were checked against
    prepared_source: str = ""  # "given" or "beside the hidden states" (speculators 0.9)

    @property
    def passed(self) -> bool:
        return not any(c.verdict == "fail" for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == "fail"]

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["extraction_dir"] = str(self.extraction_dir)
        d["claims"]["manifest_path"] = str(self.claims.manifest_path) if self.claims.manifest_path else None
        d["passed"] = self.passed
        return json.loads(json.dumps(d, default=str))


class PreparedDatasetError(InputError):
    """The prepared dataset to check token ids against cannot be read; the message names the file."""


def prepared_input_ids(prepared_dir: Path) -> list[list[int]]:
    """The `input_ids` column of a dataset saved by `datasets.save_to_disk`, read with pyarrow.

    `datasets.load_from_disk` would do, but it applies the saved format ("torch", which speculators
    needs), importing torch into whichever process verifies."""
    import pyarrow as pa

    state_path = prepared_dir / "state.json"
    try:
        state = json.loads(state_path.read_text())
        shards = [shard["filename"] for shard in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PreparedDatasetError(f"{state_path}: not a datasets save_to_disk state ({exc})") from None
    rows: list[list[int]] = []
    for name in shards:
        shard = prepared_dir / str(name)
        try:
            with pa.memory_map(str(shard)) as source:
                rows += pa.ipc.open_stream(source).read_all().column("input_ids").to_pylist()
        except (OSError, KeyError, pa.ArrowException) as exc:
            raise PreparedDatasetError(f"{shard}: cannot read its input_ids column ({exc})") from None
    return rows


def _histogram(lengths: list[int]) -> list[dict]:
    buckets = Counter(max(0, n.bit_length() - 1) for n in lengths if n > 0)
    return [{"min": 1 << k, "max": (1 << (k + 1)) - 1, "count": buckets[k]} for k in sorted(buckets)]


def _names(infos) -> list[str]:
    return [i.path.name for i in infos][:MAX_OFFENDERS]


def _per_file(name, infos, attr, want, what, source) -> Check:
    bad = [i for i in infos if getattr(i, attr) != want]
    seen = sorted({getattr(i, attr) for i in infos}, key=str)
    if want is None:
        return Check(name, "skip", None, seen, f"{source} records no {what}")
    if not bad:
        return Check(name, "pass", want, seen, f"every file has {what} {want}")
    first = bad[0]
    return Check(name, "fail", want, seen, f"{first.path.name}: {what} {getattr(first, attr)}, {source} claims "
                 f"{want} ({len(bad)} file(s) disagree)", _names(bad))


def verify_extraction(extraction_dir: Path, *, target_dir: Path | None, prepared_dir: Path | None = None,
                      full: bool = False, on_progress: ProgressFn | None = None) -> VerificationReport:
    started = time.perf_counter()
    root = Path(extraction_dir)
    layout = detect_layout(root)
    claims = read_manifest(root, layout)
    target = read_target_config(Path(target_dir)) if target_dir is not None else None
    src = str(claims.manifest_path.name) if claims.manifest_path else "the first sample file"
    checks: list[Check] = []

    # A speculators 0.9 directory carries the dataset its files were made from (upstream writes
    # hidden_states/ inside it), so its token ids are checked even when no run names a dataset.
    source = "given"
    if prepared_dir is None:
        prepared_dir, source = prepared_beside(layout), "beside the hidden states"
    rows, rows_error = None, None
    if prepared_dir is not None:
        try:
            rows = prepared_input_ids(Path(prepared_dir))
        except PreparedDatasetError as exc:
            rows_error = str(exc)

    by_index: dict[int, list[Path]] = {}
    for p in layout.files:
        by_index.setdefault(int(SAMPLE_RE.match(p.name).group(2)), []).append(p)
    infos, total, step = [], len(by_index), max(1, len(by_index) // 100)
    for n, idx in enumerate(sorted(by_index), 1):
        infos.append(read_sample(idx, by_index[idx][0], want_ids=rows is not None, full=full))
        if on_progress is not None and (n % step == 0 or n == total):
            on_progress(n, total)
    bad = [i for i in infos if i.error]
    good = [i for i in infos if not i.error]
    checks.append(Check("readable", "fail" if bad else "pass", len(infos), len(good),
                        "; ".join(i.error for i in bad[:3]) + (f" ({len(bad)} unreadable)" if bad else "")
                        if bad else f"all {len(infos)} files open", _names(bad)))

    dups = sorted(p.name for paths in by_index.values() if len(paths) > 1 for p in paths)
    expected = claims.total_samples if claims.total_samples is not None else 0
    span = max(expected, max(by_index, default=-1) + 1)
    missing = [i for i in range(span) if i not in by_index]
    stray = [i for i in by_index if claims.total_samples is not None and i >= claims.total_samples]
    msgs = []
    if missing:
        msgs.append(f"missing indices {missing[:10]} ({len(missing)} in all, e.g. hs_{missing[0]} / data_{missing[0]})")
    if dups:
        msgs.append(f"duplicate indices in {dups[:10]}")
    if stray:
        msgs.append(f"indices {sorted(stray)[:10]} beyond total_samples {claims.total_samples}")
    checks.append(Check("indices", "fail" if msgs else "pass", f"0..{span - 1}", len(by_index),
                        "; ".join(msgs) or f"indices 0..{span - 1} each present once",
                        (dups + [by_index[i][0].name for i in sorted(stray)])[:MAX_OFFENDERS]))

    count_verdict = "skip" if claims.synthesised else ("pass" if len(infos) == claims.total_samples else "fail")
    checks.append(Check("sample_count", count_verdict, claims.total_samples, len(infos),
                        f"{src} claims total_samples {claims.total_samples}, {len(infos)} sample files found"
                        if not claims.synthesised else f"no manifest; {len(infos)} sample files"))

    measured_tokens = sum(i.tokens for i in good)
    if claims.total_tokens is None:
        checks.append(Check("token_total", "skip", None, measured_tokens,
                            f"no manifest; files hold {measured_tokens} tokens"))
    else:
        ok = measured_tokens == claims.total_tokens
        checks.append(Check("token_total", "pass" if ok else "fail", claims.total_tokens, measured_tokens,
                            f"{src} claims total_tokens {claims.total_tokens}, files hold {measured_tokens}"
                            + ("" if ok or not bad else f" ({len(bad)} unreadable files not counted)")))
    if claims.sample_lengths is not None:
        off = [i for i in good if claims.sample_lengths.get(i.index) != i.tokens]
        checks.append(Check("sample_lengths", "fail" if off else "pass", len(claims.sample_lengths), len(good),
                            f"{off[0].path.name}: {off[0].tokens} tokens, sample_lengths.json says "
                            f"{claims.sample_lengths.get(off[0].index)}" if off
                            else "every file matches sample_lengths.json",
                            _names(off)))
    ragged = [i for i in good if i.ids_len is not None and i.ids_len != i.tokens]
    checks.append(Check("token_ids_length", "fail" if ragged else "pass", "T", len(good) - len(ragged),
                        f"{ragged[0].path.name}: {ragged[0].ids_len} token ids but {ragged[0].tokens} hidden-state rows"
                        if ragged else "token ids and hidden-state rows agree in every file", _names(ragged)))

    checks.append(_per_file("layer_count", good, "layers", claims.num_layers_captured, "layer count", src))
    if claims.layer_ids is not None and claims.num_layers_captured != len(claims.layer_ids):
        checks.append(Check("layer_ids_length", "fail", len(claims.layer_ids), claims.num_layers_captured,
                            f"{src}: num_layers_captured {claims.num_layers_captured} but {len(claims.layer_ids)} "
                            f"layer_ids {claims.layer_ids}"))
    checks.append(_per_file("hidden_size", good, "width", claims.hidden_size, "hidden size", src))
    if target is None:
        checks.append(Check("target_hidden_size", "skip", None, None, "no target given"))
    else:
        checks.append(_per_file("target_hidden_size", good, "width", target.hidden_size, "hidden size",
                                f"target config.json ({target.model_type}, {target.num_layers} layers)"))
    checks.append(_layer_ids_check(claims, target, good))

    default_dtype = claims.dtype is None
    want_dtype = claims.dtype or ("float8_e4m3fn" if good and good[0].dtype == "float8_e4m3fn" else "bfloat16")
    off = [i for i in good if i.dtype != want_dtype]
    verdict = "pass" if not off else ("warn" if default_dtype and len({i.dtype for i in good}) == 1 else "fail")
    checks.append(Check("dtype", verdict, want_dtype, sorted({i.dtype for i in good}),
                        f"{off[0].path.name}: dtype {off[0].dtype}, expected {want_dtype}"
                        + (" (the format's default; no manifest records a dtype)" if default_dtype else "")
                        if off else f"every file is {want_dtype}", _names(off)))

    if claims.max_seq_len is not None:
        long = [i for i in good if i.tokens > claims.max_seq_len]
        checks.append(Check("max_seq_len", "warn" if long else "pass", claims.max_seq_len,
                            max((i.tokens for i in good), default=0),
                            f"{long[0].path.name}: {long[0].tokens} tokens, longer than max_seq_len "
                            f"{claims.max_seq_len}" if long else "no file exceeds max_seq_len", _names(long)))

    checks.append(_prepared_tokens_check(rows, rows_error, prepared_dir, source, infos, good))

    if not full:
        checks.append(Check("finite", "skip", None, None, "header-only mode; run with full=True to scan values"))
    else:
        nonfinite = [i for i in good if i.finite is False]
        checks.append(Check("finite", "fail" if nonfinite else "pass", True, len(good) - len(nonfinite),
                            f"{nonfinite[0].path.name}: hidden states contain NaN or inf ({len(nonfinite)} file(s))"
                            if nonfinite else "all values finite", _names(nonfinite)))

    nbytes = sum(i.nbytes for i in infos)
    layers = claims.num_layers_captured or (good[0].layers if good else None)
    width = claims.hidden_size or (good[0].width if good else None)
    floor_dtype = good[0].dtype if good else (claims.dtype or "bfloat16")  # the bytes on disk are the files'
    seconds = time.perf_counter() - started
    report = VerificationReport(
        extraction_dir=root, layout=layout.name, claims=claims, target=target, full=full, checks=checks,
        num_files=len(infos), total_tokens=measured_tokens, bytes_on_disk=nbytes,
        bytes_per_token=nbytes / measured_tokens if measured_tokens else 0.0,
        floor_bytes_per_token=floor_bytes_per_token(layers, width, floor_dtype),
        length_histogram=_histogram([i.tokens for i in good]), seconds=seconds,
        samples_per_s=len(infos) / seconds if seconds > 0 else 0.0,
        prepared_dir=Path(prepared_dir) if prepared_dir is not None else None,
        prepared_source=source if prepared_dir is not None else "")
    log.info("verified %s (%s): %d files, %d tokens, %s", root, layout.name, len(infos), measured_tokens,
             "passed" if report.passed else f"{len(report.failures)} failing checks")
    return report


def _prepared_tokens_check(rows, rows_error, prepared_dir, source, infos, good) -> Check:
    if prepared_dir is None:
        return Check("prepared_tokens", "skip", None, None, "no prepared dataset given, and none beside the "
                     "hidden states (speculators 0.9 keeps hidden_states/ inside its prepared dataset)")
    where = f"the prepared dataset {prepared_dir} ({source})"
    if rows_error is not None:
        return Check("prepared_tokens", "fail", None, None, f"cannot check token ids against {where}: {rows_error}")
    diff = [i for i in good if i.index >= len(rows) or i.token_ids != list(rows[i.index])]
    if diff:
        first = diff[0]
        what = (f"index {first.index} has no row ({len(rows)} rows)" if first.index >= len(rows)
                else f"token ids differ from row {first.index}")
        return Check("prepared_tokens", "fail", len(rows), len(infos),
                     f"{first.path.name}: {what} of {where} ({len(diff)} file(s) disagree)", _names(diff))
    if len(rows) == len(infos):
        return Check("prepared_tokens", "pass", len(rows), len(infos),
                     f"every file's token ids equal its row of {where}")
    # More rows than files: upstream generates a prefix (--max-samples) or resumes later; a run's
    # own extraction must cover every row.
    short = source != "given" and len(rows) > len(infos)
    return Check("prepared_tokens", "warn" if short else "fail", len(rows), len(infos),
                 f"{where} has {len(rows)} rows, {len(infos)} sample files"
                 + ("; the files present match their rows" if short else ""))


def _layer_ids_check(claims: ManifestClaims, target: TargetConfig | None, good: list[SampleInfo]) -> Check:
    if target is None:
        return Check("layer_ids", "skip", claims.layer_ids, None, "no target given; cannot bound layer ids")
    n = target.num_layers
    ids = claims.layer_ids
    if ids is None:
        layers = good[0].layers if good else None
        default = default_layer_ids(n) if n >= 4 else None
        if default and layers == len(default):
            claims.layer_ids = default
            claims.layer_id_convention_reason += f"; no ids recorded, assumed the default {default}"
            return Check("layer_ids", "pass", None, default, f"no ids recorded; {layers} layers per file match "
                         f"speculators 0.9's default {default} for a {n}-layer target (assumed)")
        return Check("layer_ids", "skip", None, layers, "no manifest records layer ids")
    conv, why, top = resolve_layer_convention(ids, n, claims)
    claims.layer_id_convention, claims.layer_id_convention_reason = conv, why
    out = [i for i in ids if i < 0 or i > top]
    if out:
        return Check("layer_ids", "fail", ids, f"0..{top}", f"{claims.manifest_path.name}: layer ids {out} are "
                     f"outside this {n}-layer target (valid 0..{top} under {conv}: {why})")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        return Check("layer_ids", "fail", ids, None,
                     f"{claims.manifest_path.name}: layer ids {ids} are not strictly increasing")
    return Check("layer_ids", "pass", ids, f"0..{top}", f"ids {ids} inside 0..{top} under {conv} ({why})")
