"""The target model as the extract stage uses it: loaded in bf16 on a GPU (fp32 on the CPU), or
spread over several GPUs with transformers' device_map, and hooked to keep the hidden states of
the requested layers (see workers/stages/extract/with_transformers.py for which tensors and why)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch


def load_target(target_dir: Path, device: torch.device, num_gpus: int = 1):
    """The target in bf16 on a GPU (fp32 on the CPU). With num_gpus > 1 its layers are spread over
    GPUs 0..num_gpus-1 by transformers' device_map="auto" (accelerate), for a target too large for
    one GPU; the inputs then go to `device`, which must be cuda:0."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if num_gpus > 1:
        # Only the first num_gpus devices, and never the CPU: a layer offloaded there would run on it.
        max_memory = {i: torch.cuda.get_device_properties(i).total_memory for i in range(num_gpus)}
        model = AutoModelForCausalLM.from_pretrained(
            str(target_dir), dtype=dtype, attn_implementation="sdpa", local_files_only=True,
            device_map="auto", max_memory=max_memory,
        )
        return model.eval()
    model = AutoModelForCausalLM.from_pretrained(
        str(target_dir), dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )
    return model.to(device).eval()


def spread_device(num_gpus: int) -> torch.device:
    """Where the inputs of a target spread over `num_gpus` GPUs go (its embeddings' GPU, cuda:0);
    refuses, saying why, on a host with fewer GPUs or without accelerate."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if num_gpus > have:
        raise ValueError(f"num_gpus={num_gpus}: spreading the target needs {num_gpus} CUDA devices; "
                         f"this worker has {have}")
    if importlib.util.find_spec("accelerate") is None:
        raise ValueError(f"num_gpus={num_gpus}: spreading the target over GPUs (device_map) needs accelerate; "
                         "install it on this worker (pip install accelerate)")
    return torch.device("cuda", 0)


def place_target(num_gpus: int, device: str, error: type[Exception] = ValueError) -> tuple[torch.device, str]:
    """(where the target's inputs go, how to name where it runs) for `device`, or spread over
    num_gpus GPUs (device then ignored); `error` for a num_gpus that is not a whole number >= 1."""
    from workers.stages.device import device_label, resolve_device

    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 1:
        raise error(f"num_gpus must be a whole number of at least 1, got {num_gpus!r}")
    if num_gpus == 1:
        dev = resolve_device(device)
        return dev, device_label(dev)
    return spread_device(num_gpus), (f"cuda:0-{num_gpus - 1} ({num_gpus} x {torch.cuda.get_device_name(0)}, "
                                     "device_map=auto)")


def decoder_parts(model) -> tuple[torch.nn.Module, torch.nn.ModuleList, torch.nn.Module]:
    """(base model without lm_head, its decoder layers, its final norm)."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if base is None:
        base = model.get_decoder()
    layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
    if not isinstance(layers, torch.nn.ModuleList) or not isinstance(norm, torch.nn.Module):
        raise ValueError(
            f"{type(model).__name__}: cannot find decoder `layers` and final `norm` on its base "
            "model; this architecture is not supported for extraction yet"
        )
    return base, layers, norm


class LayerCapture:
    """Forward pre-hooks that keep the HF hidden_states[i] tensors for the requested ids."""

    def __init__(self, model, layer_ids: list[int]):
        _, layers, norm = decoder_parts(model)
        n = len(layers)
        self.layer_ids = layer_ids
        self.captured: dict[int, torch.Tensor] = {}
        self._handles = []
        for lid in layer_ids:
            module = norm if lid == n else layers[lid]
            self._handles.append(module.register_forward_pre_hook(self._hook(lid), with_kwargs=True))

    def _hook(self, lid: int):
        def hook(module, args, kwargs):
            self.captured[lid] = args[0] if args else kwargs["hidden_states"]

        return hook

    def stacked(self) -> torch.Tensor:
        """[B, T, L, H] in layer_ids order, on the first layer's device (a target spread over GPUs
        holds each layer's input on that layer's GPU)."""
        first = self.captured[self.layer_ids[0]].device
        out = torch.stack([self.captured[lid].to(first) for lid in self.layer_ids], dim=2)
        self.captured.clear()
        return out

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
