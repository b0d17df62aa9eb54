"""What a target model's directory says about itself, read from its config.json.

Pure: no Django, no torch. Large multimodal targets nest the language model's numbers under
`text_config`; that nested block wins when present.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from workers.stages.errors import InputError
from workers.stages.jsonfile import read_json_object


class TargetConfigError(InputError):
    """The target directory has no usable config.json."""


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


def read_target_config(target_dir: Path) -> TargetConfig:
    path = Path(target_dir) / "config.json"
    raw = read_json_object(path, TargetConfigError)
    text = raw.get("text_config")
    nested = isinstance(text, dict)
    cfg = text if nested else raw
    values = {}
    for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            where = "text_config." + key if nested else key
            raise TargetConfigError(f"{path}: {where} must be a positive integer, got {value!r}")
        values[key] = value
    architectures = raw.get("architectures") or cfg.get("architectures") or ["unknown"]
    return TargetConfig(
        architecture=str(architectures[0]),
        model_type=str(cfg.get("model_type") or raw.get("model_type") or "unknown"),
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
