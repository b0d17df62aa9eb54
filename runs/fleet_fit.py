"""Whether one worker fits a stage: it takes the stage's queue and can run the stage there.

The queue decides where a stage goes (workers.stages.backends.stage_queue): a worker that could run
vLLM on 4 GPUs but was started with `EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q vllm.1,vllm.2` never receives
a stage sent to vllm.4, so what a worker advertises it could run counts only for the queues it takes.
One rule for the launch form's options and the launch refusals. host_refusals judges this host
instead, for a launch whose stages run in this process (run_pipeline --inline).

No database access here: callers pass the live Worker rows (runs.fleet_selectors.workers_live)."""
from __future__ import annotations

from runs.fleet_models import Worker
from runs.routing import BACKEND_SETTINGS
from runs.run_config import RunConfig
from workers.stages.backends import (
    BACKENDS_BY_NAME,
    DEFAULT_GPU_QUEUE,
    BackendUnavailable,
    backend_require,
    stage_queue,
)


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



def host_refusals(*, config: RunConfig) -> list[tuple[str, str]]:
    """(field, why) for each backend choice of `config` this host cannot run, by its own probe
    (workers.stages.backends.backend_require, as a stage does at start); empty when it can run them.
    The live workers do not matter: none of them will run these stages."""
    refusals = []
    for backend_field, gpus_field in BACKEND_SETTINGS.values():
        name, gpus = getattr(config, backend_field), getattr(config, gpus_field)
        try:
            backend_require(name=name, gpus=gpus)
        except BackendUnavailable as exc:
            # The GPU count is at fault when this host runs the backend on one GPU (or the CPU).
            if BACKENDS_BY_NAME[name].probe(1) is None:
                refusals.append((gpus_field, f"{gpus_field} {gpus}: {exc}"))
            else:
                refusals.append((backend_field, f"{backend_field} {name}: {exc}"))
    return refusals
