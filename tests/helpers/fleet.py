"""Worker rows for tests: this host without its GPUs, and a GPU host we do not have here.

The GPU host is a stand-in (no GPU on the development machines): its capabilities are what
workers.contract.host.backends.host_capabilities() gives with that host's GPUs and libraries standing in
for this one's, and named FAKE. The CPU worker is this host probed for real with its GPUs hidden, so
that a fleet built here is the same on a GPU host."""
from __future__ import annotations

from unittest import mock

from django.utils import timezone

from runs.fleet.models import Worker
from runs.fleet.services import worker_heartbeat
from workers.contract.host import backends, vllm_env
from workers.contract.host.backends import host_capabilities, host_queues

H100_BYTES = 85_899_345_920  # what torch reports as total_memory for an 80 GiB H100


def fake_gpu_host_capabilities(*, gpus: int = 8, vllm: bool = True, speculators: bool = True,
                               accelerate: bool = True) -> dict:
    """FAKE: an 8-GPU host with vLLM and speculators: host_capabilities() itself, run here with the
    GPUs and the installed libraries standing in for that host's."""
    missing = {name for name, present in (("vllm", vllm), ("speculators", speculators), ("accelerate", accelerate))
               if not present}
    h100 = backends.Gpu(name="NVIDIA H100 80GB HBM3", memory_bytes=H100_BYTES)
    install = (vllm_env.VllmInstall(executable="/opt/eagle3web/.venv-vllm/bin/vllm", version="0.33.0", build="cuda")
               if vllm else "vllm is not installed (`make vllm` installs it beside the project, or set EAGLE3WEB_VLLM)")
    with mock.patch.object(backends, "detect_gpus", lambda: (h100,) * gpus), \
            mock.patch.object(backends, "_installed", lambda module: module not in missing), \
            mock.patch.object(backends, "_executable", lambda name: None), \
            mock.patch.object(vllm_env, "vllm_install", lambda: install):
        capabilities = host_capabilities()
    return {**capabilities, "hostname": "fake-gpu-host", "cpu_count": 64, "memory_bytes": 2 << 40,
            "versions": {"python": "3.11.7", "torch": "2.13.0+cu128", "transformers": "5.19.0",
                         "accelerate": "1.15.0" if accelerate else None, "speculators": "0.9.0",
                         "vllm": "0.33.0" if vllm else None}}


_this_host: dict = {}


def this_host_capabilities() -> dict:
    """This test machine, probed for real (no GPU on the development machines; vLLM's CPU build where
    `make vllm` ran)."""
    if not _this_host:
        _this_host.update(host_capabilities())
    return dict(_this_host)


def fake_gpu_worker(name: str = "fake-gpu@fake-gpu-host", queues: list[str] | None = None, **kwargs) -> Worker:
    """FAKE: a live worker on fake_gpu_host_capabilities(), consuming the queues such a host takes, or
    exactly `queues` (as one started with EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q <queues>)."""
    capabilities = fake_gpu_host_capabilities(**kwargs)
    queues = ["cpu", *host_queues(capabilities)] if queues is None else list(queues)
    return worker_heartbeat(name=name, hostname=capabilities["hostname"], capabilities=capabilities,
                            queues=queues, started_at=timezone.now())


_cpu_host: dict = {}


def cpu_host_capabilities() -> dict:
    """This test machine probed for real with its GPUs left out: what cpu_worker() reports on any host
    (on a GPU host its GPUs are hidden, FAKE; the fleet's GPU hosts are fake_gpu_worker rows)."""
    if not _cpu_host:
        with mock.patch.object(backends, "detect_gpus", lambda: ()):
            _cpu_host.update(host_capabilities())
    return dict(_cpu_host)


def cpu_worker(name: str = "cpu@this-host", queues: tuple[str, ...] = ("cpu", "gpu"), *,
               probe_queues: bool = True) -> Worker:
    """A live worker on this machine without GPUs (cpu_host_capabilities()), started like `make demo`'s
    (-Q cpu,gpu): it also takes the queues its probe adds (vllm.1 where `make vllm` installed vLLM's CPU
    build), unless probe_queues=False (EAGLE3WEB_WORKER_GPU_QUEUES=0: exactly `queues`)."""
    capabilities = cpu_host_capabilities()
    taken = list(dict.fromkeys([*queues, *(host_queues(capabilities) if probe_queues else [])]))
    return worker_heartbeat(name=name, hostname=capabilities["hostname"], capabilities=capabilities,
                            queues=taken, started_at=timezone.now())
