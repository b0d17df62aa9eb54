"""bench/gpu/gpu_check.py: the GPU check's own code path, run small on the CPU, and its table of peaks."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

from gpu_peaks import achieved, bf16_peak  # noqa: E402

STAGE_FIGURES = {"wall_s", "tokens", "tokens_per_s", "peak_gpu_memory_allocated_bytes", "peak_gpu_memory_used_bytes",
                 "flops_per_token", "achieved_tflops", "fraction_of_bf16_peak"}


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.5), ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA L40S", 362.05), ("NVIDIA L40", 181.05), ("NVIDIA L4", 121.0), ("NVIDIA A10", 125.0),
])
def test_bf16_peak_by_device_name(name, tflops):
    assert bf16_peak(name)[0] == tflops


def test_unknown_gpu_and_cpu_have_no_peak_and_say_why():
    assert bf16_peak("NVIDIA A10G") == (None, "'NVIDIA A10G' is not in bench/gpu/gpu_peaks.py's table of datasheet peaks; add it there")
    peak, reason = bf16_peak(None)
    assert peak is None and reason.startswith("no GPU")


def test_achieved_is_flops_times_tokens_over_the_peak():
    assert achieved(2_000_000_000, 100_000.0, 989.4) == (200.0, round(200 / 989.4, 4))
    assert achieved(2_000_000_000, 100_000.0, None) == (200.0, None)


@pytest.mark.slow
def test_tiny_cpu_run_reports_every_stage(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/gpu/gpu_check.py", "--device", "cpu", "--tiny", "--rows", "8", "--threads", "1",
         "--work-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads((tmp_path / "gpu_check.json").read_text())
    assert (report["gpu"], report["device"], report["mode"], report["torch_threads"]) == (None, "cpu", "tiny", 1)
    assert report["fraction_of_peak_null_reason"].startswith("no GPU")
    assert report["data"]["rows"] == 8 and report["data"]["truncated_rows"] == 0
    assert report["target"]["params"] > 4_000_000 and report["target"]["num_hidden_layers"] == 4
    for name in ("prepare", "extract_transformers", "vocab", "train"):
        figures = report["stages"][name]
        assert STAGE_FIGURES <= set(figures), name
        assert figures["fraction_of_bf16_peak"] is None and figures["peak_gpu_memory_allocated_bytes"] is None
    for name in ("extract_transformers", "train"):
        figures = report["stages"][name]
        assert figures["tokens"] > 0 and figures["tokens_per_s"] > 0 and figures["achieved_tflops"] > 0
    assert report["stages"]["train"]["flops_per_token"] == report["draft"]["train_flops_per_token"]
    # The stages the issue names, each with the same figures; where the time went, per phase.
    for name in ("extract_transformers", "forward_bare", "train", "train_kimi_width"):
        figures = report["stages"][name]
        assert {"tokens_per_s", "fraction_of_bf16_peak", "peak_memory_bytes", "compiles", "recompiles",
                "time_split_s"} <= set(figures), name
        assert figures["tokens_per_s"] > 0 and figures["peak_memory_bytes"] > 0, name
    # On the CPU a stage's peak is the process's peak resident size, and a process with torch loaded holds more
    # than 64 MiB: the rise above the stage's start, reported as the peak before, stays under it (prepare's about
    # 5 MiB, vocab's 0) and once read -294,912 bytes, the kernel's resident counters being approximate.
    for name in ("prepare", "extract_transformers", "forward_bare", "vocab", "train", "train_kimi_width"):
        figures = report["stages"][name]
        assert figures["peak_memory_bytes"] > 64 * 2**20 and figures["peak_memory_above_start_bytes"] >= 0, name
    assert set(report["stages"]["train"]["time_split_s"]) == {"data", "copies", "forward", "backward", "optimizer"}
    assert report["stages"]["train"]["recompiles"] == 0
    assert {"forward", "copies", "writes", "write_wait"} <= set(report["stages"]["extract_transformers"]["time_split_s"])
    assert report["stages"]["forward_bare"]["tokens"] == report["stages"]["extract_transformers"]["tokens"]
    ratio = report["stages"]["extract_transformers"]["tokens_per_s"] / report["stages"]["forward_bare"]["tokens_per_s"]
    assert report["extract_vs_bare"] == pytest.approx(ratio, rel=1e-3)
    kimi = report["stages"]["train_kimi_width"]
    assert kimi["steps_timed"] == 2 and kimi["tokens_per_step"] == 1024 and len(kimi["losses"]) == 2
    assert "train_vs_speculators" in report
    assert report["stages"]["extract_vllm"] == {"skipped": "needs a GPU; this run is on cpu"}
    assert report["stages"]["train_speculators"] == {"skipped": "needs a GPU; this run is on cpu"}
