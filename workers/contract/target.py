"""What a target model's directory says about itself, read from its config.json (and how large its
weights are, from their files).

Pure: no Django, no torch. Large multimodal targets nest the language model's numbers under
`text_config`; that nested block wins when present.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import read_json_object


class TargetConfigError(InputError):
    """The target directory has no usable config.json."""


# Bounds on what a target's config.json may claim, checked before the target is registered: every
# page and stage that walks the layers or sizes a tensor by these numbers relies on them.
# The largest public decoder stacks have ~128 layers (Kimi-K2.5: 61), widths ~16-25k and
# vocabularies ~260k; the bounds leave an order of magnitude of headroom and no more.
MAX_NUM_LAYERS = 1024
MAX_HIDDEN_SIZE = 65_536
MAX_VOCAB_SIZE = 4_194_304
MAX_ARCHITECTURES = 64  # entries in the `architectures` list
MAX_ARCHITECTURE_CHARS = 200  # TargetModel.architecture's column
MAX_MODEL_TYPE_CHARS = 100  # TargetModel.model_type's column

INT_BOUNDS = {"num_hidden_layers": MAX_NUM_LAYERS, "hidden_size": MAX_HIDDEN_SIZE, "vocab_size": MAX_VOCAB_SIZE}


@dataclass(frozen=True)
class TargetConfig:
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    nested_text_config: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _shown(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _bounded_int(value: object, *, path: Path, where: str, upper: int) -> int:
    """An integer 1..upper; bools and floats (3e9, 32.0) are refused, as HF configs hold integers."""
    if value is None:
        raise TargetConfigError(f"{path}: {where} must be a positive integer (at most {upper}), but it is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TargetConfigError(f"{path}: {where} must be a positive integer, got {_shown(value)} "
                                f"(a {type(value).__name__}; at most {upper})")
    if not 1 <= value <= upper:
        raise TargetConfigError(f"{path}: {where} must be a positive integer no larger than {upper}, "
                                f"got {_shown(value)}")
    return value


def _bounded_str(value: object, *, path: Path, where: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TargetConfigError(f"{path}: {where} must be a non-empty string, got {_shown(value)}")
    if len(value) > limit or not value.isprintable():
        raise TargetConfigError(f"{path}: {where} must be at most {limit} printable characters, got {_shown(value)}")
    return value


def _architectures(value: object, *, path: Path, where: str) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > MAX_ARCHITECTURES:
        raise TargetConfigError(f"{path}: {where} must be a list of 1..{MAX_ARCHITECTURES} strings, got {_shown(value)}")
    return [_bounded_str(v, path=path, where=f"{where}[{i}]", limit=MAX_ARCHITECTURE_CHARS) for i, v in enumerate(value)]


def target_weight_bytes(target_dir: Path) -> int | None:
    """How many bytes the target's weights take, from its files without reading a tensor:
    model.safetensors.index.json's metadata.total_size when it has one, else the size of its
    *.safetensors files (or, with none, its pytorch_model*.bin files) together. None when it has no
    weights (a config-only directory), so a caller can say nothing rather than guess."""
    target_dir = Path(target_dir)
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = read_json_object(index, InputError).get("metadata", {}).get("total_size")
        except (InputError, AttributeError):
            total = None  # unreadable or odd: the files' own sizes say the same within their headers
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return total
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
        sizes = [p.stat().st_size for p in target_dir.glob(pattern) if p.is_file()]
        if sizes:
            return sum(sizes)
    return None


def read_target_config(target_dir: Path) -> TargetConfig:
    return target_config_from(read_target_json(target_dir), path=Path(target_dir) / "config.json")


def read_target_json(target_dir: Path) -> dict:
    """The target's config.json as a JSON object, size and depth bounded."""
    return read_json_object(Path(target_dir) / "config.json", TargetConfigError)


def target_config_from(raw: dict, *, path: Path) -> TargetConfig:
    """What pages and stages need from a config.json already read (`path` is for messages)."""
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise TargetConfigError(f"{path}: text_config must be an object when present, got {_shown(text)}")
    nested = isinstance(text, dict)
    cfg = text if nested else raw
    prefix = "text_config." if nested else ""
    values = {
        key: _bounded_int(cfg.get(key), path=path, where=prefix + key, upper=upper)
        for key, upper in INT_BOUNDS.items()
    }
    architectures = ["unknown"]
    for source, where in ((raw, "architectures"), (cfg, prefix + "architectures")):
        if source.get("architectures") not in (None, []):
            architectures = _architectures(source["architectures"], path=path, where=where)
            break
    model_type = "unknown"
    for source, where in ((cfg, prefix + "model_type"), (raw, "model_type")):
        if source.get("model_type") not in (None, ""):
            model_type = _bounded_str(source["model_type"], path=path, where=where, limit=MAX_MODEL_TYPE_CHARS)
            break
    return TargetConfig(
        architecture=architectures[0],
        model_type=model_type,
        num_layers=values["num_hidden_layers"],
        hidden_size=values["hidden_size"],
        vocab_size=values["vocab_size"],
        nested_text_config=nested,
    )


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's auxiliary layers [2, N//2, N-3] plus N, the last hidden state.

    Ids index Hugging Face's `outputs.hidden_states` (0 is the embeddings output), so id i is the
    input to decoder layer i and id N is the model's final hidden state, as speculators' vLLM
    launcher records it.
    """
    if num_layers < 4:
        raise TargetConfigError(f"EAGLE-3 needs a target with at least 4 layers, this one has {num_layers}")
    aux = [2, num_layers // 2, num_layers - 3]
    return sorted(set(aux)) + [num_layers]


def validate_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    """Ids under the hidden_states-index convention: 0..N, strictly increasing, at least 2."""
    if len(layer_ids) < 2:
        raise TargetConfigError("give at least one auxiliary layer id and the last layer")
    bad = [i for i in layer_ids if i < 0 or i > num_layers]
    if bad:
        raise TargetConfigError(
            f"layer ids {bad} are outside this target: valid ids are 0..{num_layers} "
            f"(0 = embeddings, {num_layers} = last hidden state)"
        )
    if any(b <= a for a, b in zip(layer_ids, layer_ids[1:])):
        raise TargetConfigError(f"layer ids must be strictly increasing without repeats, got {layer_ids}")
    return list(layer_ids)


def target_dtype(target_dir: Path) -> str:
    """The dtype the target's config names, which the serve check and the launch's vLLM check serve it in
    (what our evaluation loads it in); 'auto' when it names none."""
    raw = read_target_json(target_dir)
    config = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    dtype = config.get("dtype") or config.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype")
    return str(dtype) if dtype in ("float32", "bfloat16", "float16") else "auto"
