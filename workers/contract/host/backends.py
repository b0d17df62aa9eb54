"""Which extraction and training backends this host can run, on how many GPUs, and why not.

Each backend has a name (stored in a run's config), a label for people, the stage it serves and a
`probe(gpus=1)` that answers None when this host can run it on that many GPUs, else the reason in
words ("vllm is not installed", "needs a GPU; this host has none"). `host_capabilities()` gathers
what a worker advertises in its heartbeat: GPUs (name, memory), each backend's reason-or-None, the
most GPUs each backend can use here, library versions and the CPU count.

Routing by queue (what a stage asks for decides where it goes):
  - the default backends on one device (transformers, eagle3web) go to "gpu", as before: every
    worker given `-Q ...,gpu` takes them, on its GPU or, without one, on the CPU;
  - anything else goes to "<backend>.<gpus>" (e.g. "vllm.2", "transformers.4", "speculators.8"),
    which only workers that probed that backend fit for that many GPUs consume.
`host_queues()` lists the queues a host with GPUs adds at start (workers/orchestration/fleet.py), so that a worker
started with no -Q, or with -Q cpu, still takes what its GPUs can run.

torch is imported inside functions only: the web tier imports this module for the names and the
queue rule and must stay torch-free (tests/views/url_map/test_web_without_torch.py). Run as
`python -m workers.contract.host.backends` it prints host_capabilities() as JSON; a worker calls that in a
child process, because initialising CUDA in Celery's parent process breaks its forked pool.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

DEFAULT_GPU_QUEUE = "gpu"
MAX_GPUS = 64  # per stage; one host holds 8 or 16 today


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int


@functools.cache
def detect_gpus() -> tuple[Gpu, ...]:
    """This process's visible CUDA devices (CUDA_VISIBLE_DEVICES applies); none without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    return tuple(Gpu(name=torch.cuda.get_device_name(i), memory_bytes=torch.cuda.get_device_properties(i).total_memory)
                 for i in range(torch.cuda.device_count()))


def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed(module: str) -> bool:
    """A top-level module is importable (found without importing it)."""
    return importlib.util.find_spec(module) is not None


def _executable(name: str) -> str | None:
    """A command on PATH or beside this Python (a virtual environment's bin/ is often not on PATH)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def _gpu_count_reason(gpus: int, have: int) -> str | None:
    if have == 0:
        return "needs a GPU; this host has none"
    if gpus > have:
        return f"needs {gpus} GPUs; this host has {have}"
    return None


def _probe_transformers(gpus: int, have: int) -> str | None:
    if not (_installed("torch") and _installed("transformers")):
        return "torch and transformers are not installed"
    if gpus == 1:
        return None  # one GPU, or the CPU on a host without one
    if reason := _gpu_count_reason(gpus, have):
        return reason
    if not _installed("accelerate"):
        return "spreading a target over several GPUs (device_map) needs accelerate, which is not installed"
    return None


def _probe_eagle3web(gpus: int, have: int) -> str | None:
    if not (_installed("torch") and _installed("transformers")):
        return "torch and transformers are not installed"
    if gpus != 1:
        return "trains on one device; choose speculators to train on several GPUs"
    return None


def _probe_vllm(gpus: int, have: int) -> str | None:
    from workers.contract.host.vllm_env import vllm_install

    install = vllm_install()
    if isinstance(install, str):
        return install
    if install.is_cpu:
        # vLLM's CPU build serves on this host's CPUs: one "device", whatever GPUs the host has.
        return None if gpus == 1 else f"vLLM's CPU build ({install.version}) runs on the CPU, not on {gpus} GPUs"
    return _gpu_count_reason(gpus, have)


def _probe_speculators(gpus: int, have: int) -> str | None:
    if not _installed("speculators"):
        return "speculators is not installed"
    if not (_executable("torchrun") or _installed("torch")):  # `python -m torch.distributed.run` is torchrun
        return "torchrun is not installed (it comes with torch)"
    return _gpu_count_reason(gpus, have)


@dataclass(frozen=True)
class Backend:
    name: str
    label: str
    stage: str  # "extract" or "train"
    default: bool  # what a run uses unless told otherwise; runs on any worker, the CPU included
    check: Callable[[int, int], str | None]  # (GPUs asked for, GPUs this host has) -> reason or None

    def probe(self, gpus: int = 1) -> str | None:
        """None when this host can run the backend on `gpus` GPUs, else why not."""
        return self.check(gpus, len(detect_gpus()))

    def max_gpus(self, have: int) -> int:
        """The most GPUs this backend can use on a host with `have` (1 for the default ones on a CPU host)."""
        return max((g for g in range(1, max(have, 1) + 1) if self.check(g, have) is None), default=0)


BACKENDS = (
    Backend("transformers", "Transformers", "extract", True, _probe_transformers),
    Backend("vllm", "vLLM", "extract", False, _probe_vllm),
    Backend("eagle3web", "eagle3web's training loop", "train", True, _probe_eagle3web),
    Backend("speculators", "speculators' trainer (torchrun)", "train", False, _probe_speculators),
)
BACKENDS_BY_NAME = {backend.name: backend for backend in BACKENDS}
EXTRACTION_BACKENDS = tuple(b.name for b in BACKENDS if b.stage == "extract")
TRAINING_BACKENDS = tuple(b.name for b in BACKENDS if b.stage == "train")


def backend_get(name: str) -> Backend:
    return BACKENDS_BY_NAME[name]


def backend_require(*, name: str, gpus: int) -> None:
    """Refuse, naming the backend and the reason, to run a stage this host cannot run."""
    backend = BACKENDS_BY_NAME.get(name)
    if backend is None:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(BACKENDS_BY_NAME)}")
    if not 1 <= gpus <= MAX_GPUS:
        raise BackendUnavailable(f"{backend.label} ({name}) needs a GPU count from 1 to {MAX_GPUS}, got {gpus}")
    reason = backend.probe(gpus)
    if reason:
        raise BackendUnavailable(f"{backend.label} ({name}) on {gpus} GPU(s) cannot run on {socket.gethostname()}: "
                                 f"{reason}")


def vllm_executable() -> str:
    """`vllm` as this worker finds it (workers.contract.host.vllm_env), for the stages that start it."""
    from workers.contract.host.vllm_env import find_vllm_executable

    return find_vllm_executable() or "vllm"


class BackendUnavailable(RuntimeError):
    """A stage reached a worker that cannot run its backend (routing should have prevented it)."""


def stage_queue(*, backend: str, gpus: int) -> str:
    """The queue a stage using `backend` on `gpus` GPUs is sent to (see the module's docstring). An
    unknown name (a run's config edited after launch) gets "<name>.<gpus>", which no worker takes:
    the pages that list queues show it rather than fail."""
    known = BACKENDS_BY_NAME.get(backend)
    if known is not None and known.default and gpus == 1:
        return DEFAULT_GPU_QUEUE
    return f"{backend}.{gpus}"


def host_queues(capabilities: dict) -> list[str]:
    """The queues a host with these capabilities adds to its -Q ones. A host without GPUs adds only
    the backend queues it runs on its CPU (vLLM's CPU build: "vllm.1"), never "gpu": it takes that
    only when started with -Q ...,gpu, as `make demo` does."""
    has_gpus = bool(capabilities.get("gpus"))
    queues = [DEFAULT_GPU_QUEUE] if has_gpus else []
    for backend in BACKENDS:
        for gpus in range(1, capabilities.get("max_gpus", {}).get(backend.name, 0) + 1):
            queue = stage_queue(backend=backend.name, gpus=gpus)
            if queue not in queues and (has_gpus or queue != DEFAULT_GPU_QUEUE):
                queues.append(queue)
    return queues


def host_memory_bytes() -> int:
    """This host's memory (where vLLM's CPU build loads a target)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def vllm_description() -> dict | None:
    """The vLLM a stage here would start (executable, version, build), None when there is none."""
    from workers.contract.host.vllm_env import vllm_install

    install = vllm_install()
    return None if isinstance(install, str) else install.as_dict()


def host_capabilities() -> dict:
    """What this host can run, as JSON-ready data (the worker's heartbeat stores it)."""
    from workers.contract.host.vllm_env import vllm_install

    gpus = detect_gpus()
    most = {b.name: b.max_gpus(len(gpus)) for b in BACKENDS}
    vllm = vllm_install()
    return {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": host_memory_bytes(),
        "gpus": [{"name": g.name, "memory_bytes": g.memory_bytes} for g in gpus],
        "backends": {b.name: b.probe(1) for b in BACKENDS},
        "max_gpus": most,
        # Why a backend cannot use more GPUs than max_gpus here (e.g. accelerate missing), or None.
        "more_gpus": {b.name: b.check(most[b.name] + 1, len(gpus)) if most[b.name] else None for b in BACKENDS},
        "versions": {"python": platform.python_version(),
                     **{d: version_of(d) for d in ("torch", "transformers", "accelerate", "speculators")},
                     "vllm": None if isinstance(vllm, str) else vllm.version},
        # The vLLM a stage would start (its own environment, see workers.contract.host.vllm_env): path and build.
        "vllm": None if isinstance(vllm, str) else vllm.as_dict(),
    }


def host_capabilities_isolated(*, timeout: float = 300) -> dict:
    """host_capabilities() computed in a child Python, so that this process never initialises CUDA."""
    proc = subprocess.run([sys.executable, "-m", "workers.contract.host.backends"], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"probing this host's backends failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(host_capabilities()))
