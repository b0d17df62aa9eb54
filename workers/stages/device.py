"""Where a stage runs: the worker's CUDA device when it has one, else the CPU."""
from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    """"auto": the worker's CUDA device when it has one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but this worker has no CUDA device")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def device_label(device: torch.device) -> str:
    """What the pages show, e.g. "cpu" or "cuda:0 (NVIDIA H200)"."""
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
