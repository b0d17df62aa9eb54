"""Verify a hidden-state extraction a user already has, in any of the layouts users bring.

Pure: no Django. A manifest is a claim, not a proof, so every claim is checked against the files.
Fast mode reads headers only (safetensors' `safe_open` validates the header and the byte coverage
without reading tensor data, as speculators' `find_corrupt_hidden_state_indices` relies on; a
`.pt` is memory-mapped by `torch.load(mmap=True)`); full mode also scans values for NaN/inf.
A `.pt` is a pickle: it is only ever loaded with `weights_only=True`, which refuses code.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from workers.stages.target import TargetConfig, default_layer_ids, read_target_config

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]
MANIFEST_NAME = "data_config.json"
SAMPLE_RE = re.compile(r"^(hs|data)_(\d+)\.(safetensors|pt)$")
MAX_OFFENDERS = 10
# safetensors dtype names -> torch names, for reports people read.
ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F8_E4M3": "float8_e4m3fn"}

HF_INDEX, LAST_N_MINUS_1, SPECFORGE = "hf_hidden_states_index", "last_is_n_minus_1", "specforge_layer_outputs"
RECORDED = "recorded in the manifest"


class LayoutError(ValueError):
    """The directory holds no extraction layout we recognise."""


class ManifestError(ValueError):
    """A manifest file is malformed, incomplete or of an unknown version."""


@dataclass(frozen=True)
class Layout:
    name: str  # "flat_v1" | "speculators_v04" | "speculators_09"
    root: Path
    manifest_path: Path | None
    sample_kind: str  # "safetensors" | "pt"
    files: tuple[Path, ...]


@dataclass
class ManifestClaims:
    model_path: str | None
    layer_ids: list[int] | None
    hidden_size: int | None
    num_layers_captured: int | None
    total_samples: int | None
    total_tokens: int | None
    max_seq_len: int | None
    dtype: str | None
    layer_id_convention: str
    layer_id_convention_reason: str
    source_format: str
    synthesised: bool
    manifest_path: Path | None
    raw: dict
    sample_lengths: dict[int, int] | None = None


@dataclass
class Check:
    name: str
    verdict: str  # "pass" | "fail" | "warn" | "skip"
    claimed: object
    measured: object
    message: str
    offending_files: list[str] = field(default_factory=list)


@dataclass
class SampleInfo:
    index: int
    path: Path
    nbytes: int
    tokens: int | None = None
    layers: int | None = None
    width: int | None = None
    dtype: str | None = None
    ids_len: int | None = None
    token_ids: list[int] | None = None
    finite: bool | None = None
    error: str | None = None


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


def _sample_files(root: Path) -> list[Path]:
    found = []
    for d in (root, root / "hidden_states"):
        if d.is_dir():
            found += [p for p in d.iterdir() if SAMPLE_RE.match(p.name)]
    return sorted(found, key=str)  # str keys: sorting 10k Paths by their parts costs more than reading headers


def _load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read ({exc})") from None


def detect_layout(extraction_dir: Path) -> Layout:
    root = Path(extraction_dir)
    if not root.is_dir():
        raise LayoutError(f"{root}: not a directory")
    files = _sample_files(root)
    manifest = root / MANIFEST_NAME
    kinds = {p.suffix.lstrip(".") for p in files}
    kind = "pt" if kinds == {"pt"} else "safetensors"
    if len(kinds) > 1:
        raise LayoutError(f"{root}: mixes .pt and .safetensors sample files; keep one kind per extraction")
    if manifest.exists():
        raw = _load_json(manifest)
        if not isinstance(raw, dict):
            raise ManifestError(f"{manifest}: expected a JSON object, got {type(raw).__name__}")
        if "data_format_version" in raw:
            if raw["data_format_version"] != 1:
                raise ManifestError(f"{manifest}: field 'data_format_version' is {raw['data_format_version']!r}; "
                                    "only flat version 1 is known")
            return Layout("flat_v1", root, manifest, kind, tuple(files))
        if "version" in raw:
            if raw["version"] != "2.0":
                raise ManifestError(f"{manifest}: field 'version' is {raw['version']!r}; only speculators "
                                    "v0.4's nested version \"2.0\" is known")
            return Layout("speculators_v04", root, manifest, "pt", tuple(files))
        raise ManifestError(f"{manifest}: field 'data_format_version' (flat) or 'version' (nested) is missing")
    if files and kind == "safetensors":
        return Layout("speculators_09", root, None, kind, tuple(files))
    seen = sorted(p.name for p in root.iterdir())[:10]
    what = f"{len(files)} data_*.pt files but no {MANIFEST_NAME}" if files else f"entries {seen}"
    raise LayoutError(f"{root}: not a known extraction layout (found {what}); expected {MANIFEST_NAME} with "
                      "sample files, or hidden_states/hs_{idx}.safetensors")


def _field(raw: dict, dotted: str, path: Path, kind, optional: bool = False):
    node = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            if optional:
                return None
            raise ManifestError(f"{path}: field '{dotted}' is missing")
        node = node[part]
    if node is None and optional:
        return None
    ok = (isinstance(node, kind) and not isinstance(node, bool)) if kind is not list else (
        isinstance(node, list) and node and all(isinstance(i, int) and not isinstance(i, bool) for i in node))
    if not ok:
        want = "a non-empty list of integers" if kind is list else kind.__name__
        raise ManifestError(f"{path}: field '{dotted}' must be {want}, got {node!r}")
    return node


def _first_header(files: tuple[Path, ...]) -> SampleInfo | None:
    for idx, p in sorted((int(SAMPLE_RE.match(p.name).group(2)), str(p)) for p in files):
        info = _read_sample(idx, Path(p), want_ids=False, full=False)
        if info.error is None:
            return info
    return None


def read_manifest(extraction_dir: Path, layout: Layout) -> ManifestClaims:
    path = layout.manifest_path
    if layout.name == "flat_v1":
        raw = _load_json(path)
        convention = raw.get("layer_id_convention")
        return ManifestClaims(
            model_path=_field(raw, "model_path", path, str),
            layer_ids=_field(raw, "layer_ids", path, list),
            hidden_size=_field(raw, "hidden_size", path, int),
            num_layers_captured=_field(raw, "num_layers_captured", path, int),
            total_samples=_field(raw, "total_samples", path, int),
            total_tokens=_field(raw, "total_tokens", path, int),
            max_seq_len=_field(raw, "max_seq_len", path, int),
            dtype=_field(raw, "dtype", path, str, optional=True),
            layer_id_convention=convention if isinstance(convention, str) else "unknown",
            layer_id_convention_reason=(RECORDED if isinstance(convention, str)
                                        else "not recorded; decided against the target's layer count"),
            source_format="flat data_config.json (data_format_version 1)",
            synthesised=False, manifest_path=path, raw=raw)
    if layout.name == "speculators_v04":
        raw = _load_json(path)
        lengths_path = layout.root / "sample_lengths.json"
        lengths_raw = _load_json(lengths_path)
        if not isinstance(lengths_raw, dict):
            raise ManifestError(f"{lengths_path}: expected a JSON object of index -> length")
        lengths = {}
        for k, v in lengths_raw.items():
            if not str(k).isdigit() or not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ManifestError(f"{lengths_path}: entry {k!r}: {v!r} is not index -> token count")
            lengths[int(k)] = v
        layer_ids = _field(raw, "hidden_states.layer_ids", path, list)
        return ManifestClaims(
            model_path=_field(raw, "model.target_model_path", path, str),
            layer_ids=layer_ids,
            hidden_size=_field(raw, "model.hidden_size", path, int),
            num_layers_captured=len(layer_ids),
            total_samples=_field(raw, "data.num_samples", path, int),
            total_tokens=sum(lengths.values()),
            max_seq_len=_field(raw, "data.seq_length", path, int),
            dtype=None,
            layer_id_convention=LAST_N_MINUS_1,
            layer_id_convention_reason="speculators v0.4 selects [2, N//2, N-3, N-1] and bounds ids by N-1",
            source_format="speculators v0.4 nested data_config.json (version 2.0) + sample_lengths.json",
            synthesised=False, manifest_path=path, raw=raw, sample_lengths=lengths)
    first = _first_header(layout.files)
    return ManifestClaims(
        model_path=None, layer_ids=None,
        hidden_size=first.width if first else None,
        num_layers_captured=first.layers if first else None,
        total_samples=len(layout.files), total_tokens=None, max_seq_len=None,
        dtype=first.dtype if first else None,
        layer_id_convention=HF_INDEX,
        layer_id_convention_reason="no manifest; speculators 0.9 resolves [2, N//2, N-3] and its vLLM launcher "
                                   "appends N (hidden_states index)",
        source_format="speculators 0.9 hidden_states/hs_{idx}.safetensors (no manifest; claims synthesised "
                      "from the lowest-index readable file)",
        synthesised=True, manifest_path=None, raw={})


def resolve_layer_convention(layer_ids: list[int], num_layers: int, claims: ManifestClaims) -> tuple[str, str, int]:
    """(convention, why, highest valid id) for these ids on an N-layer target."""
    n, last = num_layers, layer_ids[-1]
    if claims.layer_id_convention_reason == RECORDED:
        conv, why = claims.layer_id_convention, claims.layer_id_convention_reason
    elif layer_ids[:3] == [1, n // 2 - 1, n - 4]:
        conv, why = SPECFORGE, f"ids start [1, {n // 2 - 1}, {n - 4}]: SpecForge's layer outputs [1, N//2-1, N-4]"
    elif last == n:
        conv, why = HF_INDEX, f"last id equals N={n}: speculators 0.9's hidden_states index"
    elif last == n - 1:
        conv, why = LAST_N_MINUS_1, (f"last id equals N-1={n - 1}: field scripts and speculators v0.4 "
                                     "record the last layer as N-1")
    elif claims.layer_id_convention != "unknown":
        conv, why = claims.layer_id_convention, claims.layer_id_convention_reason
    else:
        conv, why = HF_INDEX, "no id matches a known pattern; assumed the hidden_states index (widest range)"
    return conv, why, (n if conv == HF_INDEX else n - 1)


def _read_sample(index: int, path: Path, *, want_ids: bool, full: bool) -> SampleInfo:
    info = SampleInfo(index=index, path=path, nbytes=path.stat().st_size)
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                keys = set(f.keys())
                if "hidden_states" not in keys or "token_ids" not in keys:
                    raise ValueError(f"needs token_ids and hidden_states, has {sorted(keys)}")
                hs = f.get_slice("hidden_states")
                shape = hs.get_shape()
                if len(shape) != 3:
                    raise ValueError(f"hidden_states has shape {shape}, expected [T, L, H]")
                info.tokens, info.layers, info.width = shape
                info.dtype = ST_DTYPES.get(hs.get_dtype(), hs.get_dtype())
                info.ids_len = f.get_slice("token_ids").get_shape()[0]
                if want_ids:
                    info.token_ids = f.get_tensor("token_ids").tolist()
                if full:
                    info.finite = _all_finite([f.get_tensor("hidden_states")])
        else:
            try:
                obj = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                obj = torch.load(str(path), map_location="cpu", weights_only=True)  # legacy, non-zip .pt
            if not isinstance(obj, dict) or "hidden_states" not in obj:
                raise ValueError("expected a dict with hidden_states")
            hs, ids = obj["hidden_states"], obj.get("input_ids", obj.get("token_ids"))
            tensors = list(hs) if isinstance(hs, (list, tuple)) else [hs[:, i] for i in range(hs.shape[1])]
            if not tensors or any(t.dim() != 2 or t.shape != tensors[0].shape for t in tensors):
                raise ValueError("hidden_states must be L tensors of one shape [T, H] or one [T, L, H]")
            (info.tokens, info.width), info.layers = tensors[0].shape, len(tensors)
            info.dtype = str(tensors[0].dtype).removeprefix("torch.")
            info.ids_len = None if ids is None else int(ids.shape[0])
            if want_ids and ids is not None:
                info.token_ids = ids.tolist()
            if full:
                info.finite = _all_finite(tensors)
    except Exception as exc:  # noqa: BLE001 - any failure to read is a finding, not a crash
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            msg = "refused: its pickle would run code or build non-tensor objects (loaded with weights_only=True)"
        info.error = f"{path.name}: {msg}"
    return info


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t.float()).all()) for t in tensors)


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

    rows = None
    if prepared_dir is not None:
        from datasets import load_from_disk

        rows = load_from_disk(str(prepared_dir)).with_format(None)["input_ids"]

    by_index: dict[int, list[Path]] = {}
    for p in layout.files:
        by_index.setdefault(int(SAMPLE_RE.match(p.name).group(2)), []).append(p)
    infos, total, step = [], len(by_index), max(1, len(by_index) // 100)
    for n, idx in enumerate(sorted(by_index), 1):
        infos.append(_read_sample(idx, by_index[idx][0], want_ids=rows is not None, full=full))
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

    if rows is None:
        checks.append(Check("prepared_tokens", "skip", None, None, "no prepared dataset given"))
    else:
        diff = [i for i in good if i.index >= len(rows) or i.token_ids != list(rows[i.index])]
        n_ok = len(rows) == len(infos)
        msg = (f"{diff[0].path.name}: token ids differ from prepared row {diff[0].index}" if diff else
               "every file's token ids equal its prepared row")
        if not n_ok:
            msg = f"prepared dataset has {len(rows)} rows, {len(infos)} sample files; " + msg
        checks.append(Check("prepared_tokens", "fail" if diff or not n_ok else "pass", len(rows), len(infos), msg,
                            _names(diff)))

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
    seconds = time.perf_counter() - started
    report = VerificationReport(
        extraction_dir=root, layout=layout.name, claims=claims, target=target, full=full, checks=checks,
        num_files=len(infos), total_tokens=measured_tokens, bytes_on_disk=nbytes,
        bytes_per_token=nbytes / measured_tokens if measured_tokens else 0.0,
        floor_bytes_per_token=layers * width * 2 if layers and width else None,
        length_histogram=_histogram([i.tokens for i in good]), seconds=seconds,
        samples_per_s=len(infos) / seconds if seconds > 0 else 0.0)
    log.info("verified %s (%s): %d files, %d tokens, %s", root, layout.name, len(infos), measured_tokens,
             "passed" if report.passed else f"{len(report.failures)} failing checks")
    return report


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
