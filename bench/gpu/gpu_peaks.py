"""What a GPU can do at most, and how many FLOPs a forward or a training step does, for bench/gpu/gpu_check.py.

Peaks are NVIDIA's datasheet figures for dense bf16 tensor-core math (the sparse figures are twice
these and no model here is sparse). They are spec sheet numbers, not measurements: on the H200 this
workplace lends, an 8192^3 bf16 matmul measured about 790 TFLOP/s against the 989 below.

FLOPs count the matrix products of the linear layers only (2 per multiply-add forward, 2 more for
each gradient the backward computes), the usual model-FLOPs rule; attention scores and softmax are
not counted, so the fractions reported are a lower bound of what the GPU did.
"""
from __future__ import annotations

import re

# (pattern over torch.cuda.get_device_name, dense bf16 TFLOP/s, which datasheet figure). First match
# wins, so the more specific names (H100 NVL, H100 PCIe, L40S) come before the general ones.
BF16_DENSE_TFLOPS: list[tuple[str, float, str]] = [
    (r"\bB200\b", 2250.0, "B200 (HGX), dense bf16"),
    (r"\bGH200\b", 989.4, "GH200, dense bf16"),
    (r"\bH200 NVL\b", 835.5, "H200 NVL, dense bf16"),
    (r"\bH200\b", 989.4, "H200 SXM, dense bf16"),
    (r"\bH100 NVL\b", 835.5, "H100 NVL, dense bf16"),
    (r"\bH100 PCIe\b", 756.5, "H100 PCIe, dense bf16"),
    (r"\bH100\b", 989.4, "H100 SXM, dense bf16"),
    (r"\bH800 PCIe\b", 756.5, "H800 PCIe, dense bf16"),
    (r"\bH800\b", 989.4, "H800 SXM, dense bf16"),
    (r"\bA100\b", 312.0, "A100, dense bf16"),
    (r"\bA800\b", 312.0, "A800, dense bf16"),
    (r"\bL40S\b", 362.05, "L40S, dense bf16"),
    (r"\bL40\b", 181.05, "L40, dense bf16"),
    (r"\bL4\b", 121.0, "L4, dense bf16"),
    (r"\bA10\b", 125.0, "A10, dense bf16"),
]


def bf16_peak(device_name: str | None) -> tuple[float | None, str]:
    """(dense bf16 TFLOP/s, what the figure is) or (None, why there is none)."""
    if not device_name:
        return None, "no GPU: the run was on the CPU, which has no bf16 tensor-core peak to compare with"
    for pattern, tflops, label in BF16_DENSE_TFLOPS:
        if re.search(pattern, device_name):
            return tflops, f"{label} (NVIDIA datasheet)"
    return None, f"{device_name!r} is not in bench/gpu/gpu_peaks.py's table of datasheet peaks; add it there"


def target_forward_flops_per_token(model) -> int:
    """2 x the decoder layers' linear weights: extraction runs the base model, not the lm_head."""
    import torch

    base = getattr(model, getattr(model, "base_model_prefix", "model"))
    return 2 * sum(m.weight.numel() for m in base.modules() if isinstance(m, torch.nn.Linear))


def draft_train_flops_per_token(draft, ttt_steps: int) -> int:
    """One training step of speculators' Eagle3DraftModel, per token. Per multiply-add: 2 forward,
    +2 for the weight's gradient when the weight trains, +2 for the input's gradient when something
    before the layer trains. `fc` reads the target's hidden states (no input gradient); the decoder
    layers and `lm_head` (frozen in speculators 0.9, but the layers below it train) run once per TTT
    step; `verifier_lm_head` makes the targets under no_grad (forward only)."""
    import torch

    total = 0
    for name, module in draft.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight_grad = 2 if module.weight.requires_grad else 0
        if name == "verifier_lm_head":
            per_mac, times = 2, 1
        elif name == "fc":
            per_mac, times = 2 + weight_grad, 1
        elif name == "lm_head" or name.startswith("layers."):
            per_mac, times = 2 + weight_grad + 2, ttt_steps
        else:
            raise ValueError(f"linear layer {name!r} of the draft is not counted by bench/gpu/gpu_peaks.py; add it there")
        total += per_mac * times * module.weight.numel()
    return total


def achieved(flops_per_token: int, tokens_per_s: float | None, peak_tflops: float | None) -> tuple[float | None, float | None]:
    """(achieved TFLOP/s, fraction of the peak); the fraction is None without a peak."""
    if not tokens_per_s:
        return None, None
    tflops = flops_per_token * tokens_per_s / 1e12
    return round(tflops, 3), (round(tflops / peak_tflops, 4) if peak_tflops else None)
