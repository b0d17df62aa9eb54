"""Which extraction layout a directory holds, and what its manifest claims.

Pure: no Django, no torch. Three layouts: our flat `data_config.json` (data_format_version 1)
with `hidden_states/hs_{i}.safetensors`, speculators v0.4's nested manifest (version "2.0") with
`data_{i}.pt` and `sample_lengths.json`, and speculators 0.9's manifest-less
`hidden_states/hs_{i}.safetensors`, whose claims are synthesised from the lowest-index readable
file. A manifest is a claim, not a proof: `verify` checks every claim against the files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.extraction.samples import SampleInfo, read_sample
from workers.contract.inputs.jsonfile import MAX_JSON_BYTES, read_json_value
from workers.contract.target import MAX_HIDDEN_SIZE, MAX_NUM_LAYERS

MANIFEST_NAME = "data_config.json"
SAMPLE_RE = re.compile(r"^(hs|data)_(\d+)\.(safetensors|pt)$")

HF_INDEX, LAST_N_MINUS_1, SPECFORGE = "hf_hidden_states_index", "last_is_n_minus_1", "specforge_layer_outputs"
RECORDED = "recorded in the manifest"

# Bounded input: what a manifest (or, without one, the first sample file's header) may claim,
# checked before an import stores anything. String limits follow the columns they are stored in.
MAX_MODEL_PATH_CHARS = 1000  # the path limit of runs.data.paths (TargetModel.path's column)
MAX_DTYPE_CHARS = 30  # Extraction.dtype's column; real names are short ("bfloat16", "float8_e4m3fn")
MAX_CONVENTION_CHARS = 50  # Extraction.layer_id_convention's column
MAX_LAYER_IDS = MAX_NUM_LAYERS + 1  # ids 0..N of the largest target
MAX_SAMPLES = 2**31 - 1  # Extraction.num_samples is a 32-bit column
MAX_TOTAL_TOKENS = 2**53  # exact in a float; far beyond any extraction on disk
MAX_SEQ_LEN = 16 * 1024 * 1024
MAX_SAMPLE_LENGTH = 2**31 - 1
MAX_SAMPLE_LENGTHS_BYTES = 8 * MAX_JSON_BYTES  # sample_lengths.json: ~4M samples
INT_BOUNDS = {  # claim -> (lowest, highest)
    "hidden_size": (1, MAX_HIDDEN_SIZE),
    "num_layers_captured": (1, MAX_LAYER_IDS),
    "total_samples": (0, MAX_SAMPLES),
    "total_tokens": (0, MAX_TOTAL_TOKENS),
    "max_seq_len": (1, MAX_SEQ_LEN),
}
STR_BOUNDS = {"model_path": MAX_MODEL_PATH_CHARS, "dtype": MAX_DTYPE_CHARS, "layer_id_convention": MAX_CONVENTION_CHARS}


class LayoutError(InputError):
    """The directory holds no extraction layout we recognise."""


class ManifestError(InputError):
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


def _sample_files(root: Path) -> list[Path]:
    found = []
    for d in (root, root / "hidden_states"):
        if d.is_dir():
            found += [p for p in d.iterdir() if SAMPLE_RE.match(p.name)]
    return sorted(found, key=str)  # str keys: sorting 10k Paths by their parts costs more than reading headers


def _load_json(path: Path, max_bytes: int = MAX_JSON_BYTES):
    return read_json_value(path, ManifestError, max_bytes=max_bytes)


def _shown(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
            version = raw["data_format_version"]
            if isinstance(version, bool) or version != 1:
                raise ManifestError(f"{manifest}: field 'data_format_version' is {_shown(version)}; "
                                    "only flat version 1 is known")
            return Layout("flat_v1", root, manifest, kind, tuple(files))
        if "version" in raw:
            if raw["version"] != "2.0":
                raise ManifestError(f"{manifest}: field 'version' is {_shown(raw['version'])}; only speculators "
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
        raise ManifestError(f"{path}: field '{dotted}' must be {want}, got {_shown(node)}")
    return node


def _check_claims(claims: "ManifestClaims", source: str, names: dict[str, str]) -> "ManifestClaims":
    """Bounds on every claim, before anything is stored; `names` maps a claim to its field in `source`."""
    def where(claim: str) -> str:
        return f"{source}: field '{names.get(claim, claim)}'"

    for claim, (low, high) in INT_BOUNDS.items():
        value = getattr(claims, claim)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ManifestError(f"{where(claim)} must be an integer, got {_shown(value)}")
        if not low <= value <= high:
            raise ManifestError(f"{where(claim)} must be between {low} and {high}, got {_shown(value)}")
    for claim, limit in STR_BOUNDS.items():
        value = getattr(claims, claim)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ManifestError(f"{where(claim)} must be a string, got {_shown(value)}")
        if len(value) > limit:
            raise ManifestError(f"{where(claim)} is {len(value)} characters long; at most {limit} are allowed "
                                f"(got {_shown(value)})")
        if not value.isprintable():
            raise ManifestError(f"{where(claim)} holds control characters, got {_shown(value)}")
    ids = claims.layer_ids
    if ids is not None:
        if len(ids) > MAX_LAYER_IDS:
            raise ManifestError(f"{where('layer_ids')} lists {len(ids)} ids; at most {MAX_LAYER_IDS} "
                                f"(0..{MAX_NUM_LAYERS}) are allowed")
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_NUM_LAYERS]
        if bad:
            raise ManifestError(f"{where('layer_ids')} must hold integers 0..{MAX_NUM_LAYERS}, got {_shown(bad)}")
    return claims


def prepared_beside(layout: Layout) -> Path | None:
    """The prepared dataset a speculators 0.9 directory was generated from, where upstream puts it.

    `speculators generate-offline-data` reads a `save_to_disk` dataset and, unless told
    otherwise, writes `hidden_states/hs_{i}.safetensors` inside it (cli/generate_offline_data.py:
    265-270), file i holding row i's token ids (its check: data_generation/offline.py:16-18; the
    trainer's: train/data.py ArrowDataset._get_raw_data). So the dataset is the folder holding the
    sample files' folder, recognised by the `state.json` and `dataset_info.json` save_to_disk writes.
    """
    if layout.name != "speculators_09" or not layout.files:
        return None
    candidate = layout.files[0].parent.parent
    if (candidate / "state.json").is_file() and (candidate / "dataset_info.json").is_file():
        return candidate
    return None


def _first_header(files: tuple[Path, ...]) -> SampleInfo | None:
    for idx, p in sorted((int(SAMPLE_RE.match(p.name).group(2)), str(p)) for p in files):
        info = read_sample(idx, Path(p), want_ids=False, full=False)
        if info.error is None:
            return info
    return None


def read_manifest(extraction_dir: Path, layout: Layout) -> ManifestClaims:
    path = layout.manifest_path
    if layout.name == "flat_v1":
        raw = _load_json(path)
        convention = raw.get("layer_id_convention")
        if convention is not None and not isinstance(convention, str):
            raise ManifestError(f"{path}: field 'layer_id_convention' must be a string, got {_shown(convention)}")
        return _check_claims(ManifestClaims(
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
            synthesised=False, manifest_path=path, raw=raw), str(path), {})
    if layout.name == "speculators_v04":
        raw = _load_json(path)
        lengths_path = layout.root / "sample_lengths.json"
        lengths_raw = _load_json(lengths_path, MAX_SAMPLE_LENGTHS_BYTES)
        if not isinstance(lengths_raw, dict):
            raise ManifestError(f"{lengths_path}: expected a JSON object of index -> length")
        if len(lengths_raw) > MAX_SAMPLES:
            raise ManifestError(f"{lengths_path}: {len(lengths_raw)} entries; at most {MAX_SAMPLES}")
        lengths = {}
        for k, v in lengths_raw.items():
            if (not (k.isascii() and k.isdigit()) or len(k) > 10 or not isinstance(v, int) or isinstance(v, bool)
                    or not 0 <= v <= MAX_SAMPLE_LENGTH):
                raise ManifestError(f"{lengths_path}: entry {_shown(k)}: {_shown(v)} is not index -> token count "
                                    f"(an index of at most 10 digits, a count 0..{MAX_SAMPLE_LENGTH})")
            lengths[int(k)] = v
        layer_ids = _field(raw, "hidden_states.layer_ids", path, list)
        return _check_claims(ManifestClaims(
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
            synthesised=False, manifest_path=path, raw=raw, sample_lengths=lengths), str(path),
            {"model_path": "model.target_model_path", "layer_ids": "hidden_states.layer_ids",
             "num_layers_captured": "hidden_states.layer_ids", "hidden_size": "model.hidden_size",
             "total_samples": "data.num_samples", "total_tokens": f"sum of {lengths_path.name}",
             "max_seq_len": "data.seq_length"})
    first = _first_header(layout.files)
    return _check_claims(ManifestClaims(
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
        synthesised=True, manifest_path=None, raw={}),
        f"{first.path if first else layout.root} (no manifest; read from its header)",
        {"hidden_size": "width", "num_layers_captured": "layers", "total_samples": "sample file count"})


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
