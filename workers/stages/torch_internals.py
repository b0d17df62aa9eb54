"""Every private torch name the stages read, in one place, each with what it is for.

The CUDA training path keeps flex attention compiled (raising dynamo's recompile limit, and failing
where the limit is hit rather than falling back to a dense kernel), counts the graphs dynamo built,
and an extraction gives torch's pinned host cache back. None of that has a public API in torch 2.x.
The names below are read only through this module (tests/stages/test_torch_internals.py checks
that no other module of workers/ names them), so that a torch that renamed one fails at once, naming
the name, the torch and the versions we support, instead of deep inside a training on a GPU.

Supported torch versions (docs/workers/gpus.md, "Supported torch"): 2.13.0 (requirements.txt: CI and the CPU
workers; these names are checked against it in the suite) and 2.14.0 (Dockerfile.gpu takes
vLLM 0.33.0's CUDA build; not installed here, so not checked by the suite). The CUDA path also ran on
torch 2.11 (an H200), by hand.
"""
from __future__ import annotations

import importlib

import torch

SUPPORTED_TORCH = ("2.13", "2.14")

# (module, name) -> why the stages need it. Required: the CUDA training path stops without it.
REQUIRED = {
    ("torch._dynamo.config", "recompile_limit"):
        "compiled flex attention recompiles per padded step length, TTT step and grad mode",
    ("torch._dynamo.config", "accumulated_recompile_limit"): "the same, summed over every function",
    ("torch._dynamo.config", "fail_on_recompile_limit_hit"):
        "past the limit flex would run eagerly, a dense T x (s+1)T fallback that fills the GPU",
    ("torch._dynamo.utils", "counters"): "the graphs compiled, reported with each training",
    ("torch.nn.attention.flex_attention", "flex_attention"): "the CUDA path's attention kernel",
    ("torch.nn.attention.flex_attention", "create_block_mask"): "speculators' block mask for it",
    ("torch.nn.attention.flex_attention", "BlockMask"): "the mask type the attention function dispatches on",
}
# Optional: a torch without it does without (an extraction keeps torch's pinned host cache).
OPTIONAL = {
    ("torch._C", "_host_emptyCache"): "gives freed pinned buffers back to the system after an extraction",
}


class TorchInternalsMissing(RuntimeError):
    """The installed torch lacks a private name the stages need."""


def _read(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        why = REQUIRED.get((module, name)) or OPTIONAL.get((module, name), "")
        raise TorchInternalsMissing(
            f"torch {torch.__version__} has no {module}.{name} ({why}); eagle3web's CUDA training supports "
            f"torch {', '.join(SUPPORTED_TORCH)}: install one of those (docs/workers/gpus.md)") from None


def missing_names() -> list[str]:
    """The required names the installed torch lacks, as "module.name" (empty on a supported torch)."""
    missing = []
    for module, name in REQUIRED:
        try:
            _read(module, name)
        except TorchInternalsMissing:
            missing.append(f"{module}.{name}")
    return missing


def flex_attention_api():
    """(BlockMask, create_block_mask, flex_attention) from torch.nn.attention.flex_attention (a
    prototype API whose home has moved between releases)."""
    module = "torch.nn.attention.flex_attention"
    return _read(module, "BlockMask"), _read(module, "create_block_mask"), _read(module, "flex_attention")


def raise_recompile_limit(limit: int) -> None:
    """Let each function compile `limit` graphs (all of them 4x that) in this process, and make
    going past it an error (FailOnRecompileLimitHit) rather than an eager fallback. Process-wide:
    the training that calls it runs in a process of its own (workers.stages.train.processes.in_child)."""
    config = importlib.import_module("torch._dynamo.config")
    for name in ("recompile_limit", "accumulated_recompile_limit", "fail_on_recompile_limit_hit"):
        _read("torch._dynamo.config", name)
    config.recompile_limit = max(config.recompile_limit, limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * limit)
    config.fail_on_recompile_limit_hit = True


def compiled_graph_count() -> int:
    """Graphs dynamo compiled in this process so far (a recompile adds one too): dynamo's
    counters["stats"]["unique_graphs"], which reads 0 (never an error) if the key were renamed;
    tests/stages/test_torch_internals.py checks that a compile counts."""
    return int(_read("torch._dynamo.utils", "counters")["stats"]["unique_graphs"])


def release_pinned_host_cache() -> None:
    """Give the pinned host buffers torch caches back to the system; nothing where torch lacks it."""
    try:
        release = _read("torch._C", "_host_emptyCache")
    except TorchInternalsMissing:
        return
    release()
