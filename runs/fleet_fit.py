"""Whether one worker fits a stage: it takes the stage's queue and can run the stage there.

The queue decides where a stage goes (workers.stages.backends.stage_queue): a worker that could run
vLLM on 4 GPUs but was started with `EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q vllm.1,vllm.2` never receives
a stage sent to vllm.4, so what a worker advertises it could run counts only for the queues it takes.
One rule for the launch form's options and the launch refusals. host_refusals judges this host
instead, for a launch whose stages run in this process (run_pipeline --inline).

No database access here: callers pass the live Worker rows (runs.fleet_selectors.workers_live)."""
from __future__ import annotations

import socket

from runs.fleet_models import Worker
from workers.stages import backends as this_host  # detect_gpus read through the module: a test may stand one in
from runs.routing import BACKEND_SETTINGS
from runs.run_config import RunConfig
from workers.stages.backends import (
    BACKENDS_BY_NAME,
    DEFAULT_GPU_QUEUE,
    BackendUnavailable,
    backend_require,
    stage_queue,
)


# The share of GPU memory a target's weights may fill: the rest goes to the CUDA context, a batch's
# activations and vLLM's KV cache; a target above it fails to load, or runs out of memory mid-way.
MEMORY_HEADROOM = 0.9
# The stages whose backend loads the whole target on its GPUs. speculators' trainer reads only the
# verifier's embeddings and lm_head, eagle3web's loop likewise: training is not judged by the target.
LOADS_TARGET = ("extract",)


def gb_text(count_bytes: int) -> str:
    return f"{count_bytes / 1e9:.1f} GB"


def gpus_text(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def takes(worker: Worker, queue: str) -> bool:
    return queue in (worker.queues or [])


def worker_unfit(worker: Worker, *, backend: str, gpus: int) -> str | None:
    """None when `worker` takes the queue of `backend` on `gpus` GPUs and can run it there, else why
    not in words. What the worker can run comes first, so that "needs 9 GPUs; this host has 8" is
    said rather than only the queue it does not take."""
    known = BACKENDS_BY_NAME.get(backend)
    if known is None:
        return f"unknown backend {backend!r}"
    queue = stage_queue(backend=backend, gpus=gpus)
    if queue != DEFAULT_GPU_QUEUE:
        # The default backends on one device run on any worker that takes "gpu" (on its GPU, or
        # the CPU): that was true before workers reported anything, and a probe that failed on a
        # worker (capabilities without backends) must not stop the defaults.
        caps = worker.capabilities or {}
        reason = (caps.get("backends") or {}).get(backend, "it does not report this backend")
        if reason:
            return reason
        most = (caps.get("max_gpus") or {}).get(backend, 0)
        if gpus > most:
            return (caps.get("more_gpus") or {}).get(backend) or f"it runs {known.label} on {gpus_text(most)} at most"
    if not takes(worker, queue):
        return f"it does not take {queue} (it takes {', '.join(worker.queues or []) or 'no queue'})"
    return None



def gpu_memory_bytes(gpus_memory: list[int], *, gpus: int) -> int:
    """The memory of the `gpus` largest of these GPUs together; 0 when there are fewer."""
    sizes = sorted(gpus_memory, reverse=True)
    return sum(sizes[:gpus]) if len(sizes) >= gpus else 0


def worker_gpu_memory(worker: Worker, *, gpus: int) -> int:
    return gpu_memory_bytes([int(g.get("memory_bytes") or 0) for g in (worker.capabilities or {}).get("gpus") or []],
                            gpus=gpus)


def holds(*, memory_bytes: int, weight_bytes: int) -> bool:
    return memory_bytes * MEMORY_HEADROOM >= weight_bytes


def memory_judged(*, stage_name: str, backend: str, gpus: int) -> bool:
    """Whether the target's size decides who can run this stage: a GPU backend loading the target. The
    defaults on one device (queue "gpu") are not judged: they run on the CPU on a worker without a GPU."""
    return stage_name in LOADS_TARGET and stage_queue(backend=backend, gpus=gpus) != DEFAULT_GPU_QUEUE


def too_large(*, weight_bytes: int, label: str, gpus: int, where: str, memory_bytes: int) -> str:
    return (f"the target's weights take {gb_text(weight_bytes)}, more than {MEMORY_HEADROOM:.0%} of the memory of "
            f"{label} on {gpus_text(gpus)}: {where} has {gb_text(memory_bytes)} on {gpus_text(gpus)}")


def host_refusals(*, config: RunConfig, weight_bytes: int | None = None) -> list[tuple[str, str]]:
    """(field, why) for each backend choice of `config` this host cannot run, by its own probe
    (workers.stages.backends.backend_require, as a stage does at start); empty when it can run them.
    The live workers do not matter: none of them will run these stages. `weight_bytes` (the
    target's, None when unknown): a GPU backend loading the target must find it room on this host's GPUs."""
    refusals = []
    for stage_name, (backend_field, gpus_field) in BACKEND_SETTINGS.items():
        name, gpus = getattr(config, backend_field), getattr(config, gpus_field)
        try:
            backend_require(name=name, gpus=gpus)
        except BackendUnavailable as exc:
            # The GPU count is at fault when this host runs the backend on one GPU (or the CPU).
            if BACKENDS_BY_NAME[name].probe(1) is None:
                refusals.append((gpus_field, f"{gpus_field} {gpus}: {exc}"))
            else:
                refusals.append((backend_field, f"{backend_field} {name}: {exc}"))
            continue
        if weight_bytes and memory_judged(stage_name=stage_name, backend=name, gpus=gpus):
            memory = gpu_memory_bytes([gpu.memory_bytes for gpu in this_host.detect_gpus()], gpus=gpus)
            if not holds(memory_bytes=memory, weight_bytes=weight_bytes):
                refusals.append((gpus_field, f"{gpus_field} {gpus}: " + too_large(
                    weight_bytes=weight_bytes, label=BACKENDS_BY_NAME[name].label, gpus=gpus,
                    where=f"this host ({socket.gethostname()})", memory_bytes=memory)))
    return refusals
