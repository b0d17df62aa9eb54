"""workers.orchestration.system_metrics.GpuMeter against NVML's calls, with a stand-in `pynvml` module: MOCKED, there is
no GPU or NVIDIA driver on the machines these tests run on. What this checks is our side: which devices a
process sees under CUDA_VISIBLE_DEVICES (indices, UUIDs, CUDA's stop at the first bad entry), the
figures taken from NVML's structs, a figure NVML refuses left out rather than written as 0, and the
series keys the run page charts. NVML's own answers on a real card were not seen here."""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from workers.orchestration.system_metrics import GpuMeter, SystemMeter, series_values

GIB = 2**30


@dataclass
class _Card:
    uuid: str
    util: int | None  # None: NVML refuses (a MIG slice has no utilisation of its own)
    used: int
    total: int


CARDS = [_Card("GPU-aaaa", 97, 40 * GIB, 80 * GIB), _Card("GPU-bbbb", 12, 3 * GIB, 80 * GIB),
         _Card("GPU-cccc", None, 1 * GIB, 10 * GIB)]


def _fake_pynvml(cards: list[_Card], *, init_fails: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def by_uuid(uuid: str):
        return next(card for card in cards if card.uuid == uuid)

    def utilization(card: _Card):
        if card.util is None:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=card.util, memory=0)

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = init
    nvml.nvmlDeviceGetCount = lambda: len(cards)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: cards[i]
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetUtilizationRates = utilization
    nvml.nvmlDeviceGetMemoryInfo = lambda card: types.SimpleNamespace(used=card.used, total=card.total,
                                                                      free=card.total - card.used)
    return nvml


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(CARDS))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_every_gpu_with_its_utilisation_and_memory_mocked_nvml(nvml):
    assert GpuMeter().read() == [
        {"index": 0, "util_percent": 97.0, "memory_used_bytes": 40 * GIB, "memory_total_bytes": 80 * GIB},
        {"index": 1, "util_percent": 12.0, "memory_used_bytes": 3 * GIB, "memory_total_bytes": 80 * GIB},
        # Refused utilisation: left out, not 0.
        {"index": 2, "memory_used_bytes": 1 * GIB, "memory_total_bytes": 10 * GIB}]


@pytest.mark.parametrize("visible, expected_used_gib", [
    ("1", [3]),  # the process's GPU 0 is the card NVML numbers 1
    ("2,0", [1, 40]),  # in CUDA's order, not NVML's
    ("GPU-bbbb,GPU-aaaa", [3, 40]),  # by UUID
    ("0,-1,1", [40]),  # CUDA stops at the first entry it cannot use
    ("7", []),  # no such card: none seen
    ("", []),  # an empty list hides every GPU
])
def test_the_gpus_the_process_sees_under_cuda_visible_devices_mocked_nvml(nvml, monkeypatch, visible,
                                                                           expected_used_gib):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus = GpuMeter().read()
    assert [gpu["memory_used_bytes"] // GIB for gpu in gpus] == expected_used_gib
    assert [gpu["index"] for gpu in gpus] == list(range(len(expected_used_gib)))  # numbered as the process sees


def test_a_sample_names_one_series_per_gpu_and_figure_mocked_nvml(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    values = series_values(SystemMeter().sample())
    assert values["system/gpu0_util_percent"] == 97.0 and values["system/gpu0_memory_used_bytes"] == 40 * GIB
    assert values["system/gpu1_memory_used_bytes"] == 1 * GIB
    assert "system/gpu1_util_percent" not in values  # what NVML refused stays absent
    assert "system/rss_bytes" in values  # the CPU side is read beside it


def test_no_driver_means_no_gpu_figures_mocked_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(CARDS, init_fails=True))
    # And no torch that initialised CUDA in this process (on a GPU host it may have): its figures would stand in.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    sample = SystemMeter().sample()
    assert "gpus" not in sample and not any("gpu" in key for key in series_values(sample))
