"""Whether one worker fits a stage: it takes the stage's queue and can run the stage there.

The queue decides where a stage goes (workers.contract.host.backends.stage_queue): a worker that could run
vLLM on 4 GPUs but was started with `EAGLE3WEB_WORKER_GPU_QUEUES=0 -Q vllm.1,vllm.2` never receives
a stage sent to vllm.4, so what a worker advertises it could run counts only for the queues it takes.
One rule for the launch form's options and the launch refusals. host_refusals judges this host
instead, for a launch whose stages run in this process (run_pipeline --inline).

No database access here: callers pass the live Worker rows (runs.fleet.selectors.workers_live)."""
from __future__ import annotations

import socket
from dataclasses import dataclass

from runs.fleet.models import Worker
from runs.pipeline.dispatch.routing import ROUTED_STAGES, backend_field, gpus_field, stage_backend, stage_problem
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.host import backends as this_host  # detect_gpus read through the module: a test may stand one in
from workers.contract.host.backends import (
    BACKENDS_BY_NAME,
    DEFAULT_GPU_QUEUE,
    BackendUnavailable,
    backend_require,
    stage_queue,
)


# The share of GPU memory a target's weights may fill: the rest goes to the CUDA context, a batch's
# activations and vLLM's KV cache; a target above it fails to load, or runs out of memory mid-way.
MEMORY_HEADROOM = 0.9
# The stages whose backend loads the whole target on its GPUs: extraction, and measuring acceptance
# (Transformers on the extraction's GPU count). speculators' trainer reads only the verifier's
# embeddings and lm_head, eagle3web's loop likewise: training is not judged by the target.
LOADS_TARGET = ("extract", "evaluate")
# What a stage whose backend a run does not choose does with the GPU count it shares, said before
# why that count is refused: the user changed nothing about measuring acceptance, so name it.
DERIVED_NEEDS = {"evaluate": "measuring acceptance loads the target with {label} on {gpus}"}


@dataclass(frozen=True)
class BackendOption:
    """One backend as the launch form offers it, judged against the live workers."""

    name: str
    label: str
    stage: str
    available: bool
    reason: str  # why it is not offered ("" when it is)
    max_gpus: int  # the most GPUs some live worker takes it on
    gpu_reason: str  # why not more than max_gpus
    # The GPU counts some live worker takes it on (its queue) and can run it on: not always 1..max_gpus,
    # e.g. a worker started with -Q vllm.2 alone takes vLLM on 2 GPUs and on no other count.
    gpu_counts: tuple[int, ...] = ()

    @property
    def counts_text(self) -> str:
        """"up to 8 GPUs", or the counts themselves when some are missing ("on 1, 2 GPUs")."""
        if self.gpu_counts == tuple(range(1, self.max_gpus + 1)):
            return f"up to {gpus_text(self.max_gpus)}"
        return f"on {', '.join(map(str, self.gpu_counts))} GPU{'s' if self.gpu_counts != (1,) else ''}"


def gb_text(count_bytes: int) -> str:
    """140.0 GB, 8.7 MB: decimal units, the largest under which the size is at least 1 (as the launch form's)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count_bytes >= scale:
            return f"{count_bytes / scale:.1f} {unit}"
    return f"{count_bytes} bytes"


def gpus_text(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def takes(worker: Worker, queue: str) -> bool:
    return queue in (worker.queues or [])


def queues_text(worker: Worker) -> str:
    """The queues `worker` takes, for a reason in words ("cpu, gpu", or "no queue")."""
    return ", ".join(worker.queues or []) or "no queue"


def worker_unfit(worker: Worker, *, backend: str, gpus: int) -> str | None:
    """None when `worker` takes the queue of `backend` on `gpus` GPUs and can run it there, else why
    not in words. What the worker can run comes first, so that "needs 9 GPUs; this host has 8" is
    said rather than only the queue it does not take."""
    if reason := worker_cannot_run(worker, backend=backend, gpus=gpus):
        return reason
    queue = stage_queue(backend=backend, gpus=gpus)
    if not takes(worker, queue):
        return f"it does not take {queue} (it takes {queues_text(worker)})"
    return None


def worker_cannot_run(worker: Worker, *, backend: str, gpus: int) -> str | None:
    """Why `worker` could not run `backend` on `gpus` GPUs whatever queues it took; None when it could."""
    known = BACKENDS_BY_NAME.get(backend)
    if known is None:
        return f"unknown backend {backend!r}"
    if stage_queue(backend=backend, gpus=gpus) != DEFAULT_GPU_QUEUE:
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
    return None


def gpu_memory_bytes(gpus_memory: list[int], *, gpus: int) -> int:
    """The memory of the `gpus` largest of these GPUs together; 0 when there are fewer."""
    sizes = sorted(gpus_memory, reverse=True)
    return sum(sizes[:gpus]) if len(sizes) >= gpus else 0


def worker_gpu_memory(worker: Worker, *, gpus: int) -> int:
    return gpu_memory_bytes([int(g.get("memory_bytes") or 0) for g in (worker.capabilities or {}).get("gpus") or []],
                            gpus=gpus)


def runs_on_cpu(capabilities: dict, *, backend: str) -> bool:
    """Whether these capabilities run `backend` on the host's CPU (vLLM's CPU build), where the target's
    weights go to the host's memory rather than GPUs'."""
    return backend == "vllm" and ((capabilities.get("vllm") or {}).get("build") == "cpu")


def worker_memory(worker: Worker, *, backend: str, gpus: int) -> int:
    """The memory `backend` on `gpus` GPUs loads the target into on this worker: its GPUs', or its
    host's for a backend it runs on the CPU."""
    caps = worker.capabilities or {}
    if runs_on_cpu(caps, backend=backend):
        return int(caps.get("memory_bytes") or 0)
    return worker_gpu_memory(worker, gpus=gpus)


def holds(*, memory_bytes: int, weight_bytes: int) -> bool:
    return memory_bytes * MEMORY_HEADROOM >= weight_bytes


def memory_judged(*, stage_name: str, backend: str, gpus: int) -> bool:
    """Whether the target's size decides who can run this stage: a GPU backend loading the target. The
    defaults on one device (queue "gpu") are not judged: they run on the CPU on a worker without a GPU."""
    return stage_name in LOADS_TARGET and stage_queue(backend=backend, gpus=gpus) != DEFAULT_GPU_QUEUE


def too_large(*, weight_bytes: int, label: str, gpus: int, where: str, memory_bytes: int) -> str:
    return (f"the target's weights take {gb_text(weight_bytes)}, more than {MEMORY_HEADROOM:.0%} of the memory of "
            f"{label} on {gpus_text(gpus)}: {where} has {gb_text(memory_bytes)} on {gpus_text(gpus)}")


def stage_needs(*, stage_name: str, backend: str, gpus: int) -> str:
    """"measuring acceptance loads the target with Transformers on 4 GPUs" for a stage whose backend
    the run does not choose; "" for the others (their field names what was chosen)."""
    if stage_name not in DERIVED_NEEDS:
        return ""
    return DERIVED_NEEDS[stage_name].format(label=BACKENDS_BY_NAME[backend].label, gpus=gpus_text(gpus))


def said_already(refusals: list[tuple[str | None, str]], *, stage_name: str, field: str) -> bool:
    """A derived stage (measuring acceptance) shares its GPU count with extraction: once that field is
    refused, its own refusal adds nothing the user can act on, and with the same backend it says the same."""
    return backend_field(stage_name) is None and any(said == field for said, _ in refusals)


def _choice_reason(option: BackendOption, *, gpus: int, live: list[Worker]) -> tuple[str, str] | None:
    """("backend" or "gpus": which choice is at fault, why) when no live worker takes `option` on `gpus`
    GPUs; None when one does. Live workers that could run it there but do not take its queue are
    named: starting them with that queue is the fix (e.g. a vLLM host started with -Q vllm.2 alone
    when measuring acceptance needs transformers.2)."""
    if gpus in option.gpu_counts:
        return None
    if not option.available:
        return "backend", option.reason
    queue = stage_queue(backend=option.name, gpus=gpus)
    able = [w for w in live if worker_cannot_run(w, backend=option.name, gpus=gpus) is None]
    also = "".join(f"; {w.name} could run it but does not take {queue} (it takes {queues_text(w)})"
                   for w in able[:3])
    if gpus > option.max_gpus:
        return "gpus", option.gpu_reason + also
    return "gpus", (f"no live worker takes {queue} ({option.label} on {gpus_text(gpus)}); "
                    f"live workers take {option.label} on {', '.join(map(str, option.gpu_counts))} GPU(s){also}")


def _memory_reason(*, live: list[Worker], backend: str, gpus: int, weight_bytes: int) -> str | None:
    """Why not, when no live worker that takes this queue has `gpus` GPUs whose memory holds the target."""
    fitting = [w for w in live if worker_unfit(w, backend=backend, gpus=gpus) is None]
    best = max(fitting, key=lambda w: worker_memory(w, backend=backend, gpus=gpus))
    memory = worker_memory(best, backend=backend, gpus=gpus)
    if holds(memory_bytes=memory, weight_bytes=weight_bytes):
        return None
    where = f"the best live worker that takes {stage_queue(backend=backend, gpus=gpus)}, {best.name},"
    return too_large(weight_bytes=weight_bytes, label=BACKENDS_BY_NAME[backend].label, gpus=gpus, where=where,
                     memory_bytes=memory)


def routed_refusal(*, stage_name: str, config: dict, options: dict[str, BackendOption], live: list[Worker],
                   weight_bytes: int | None) -> tuple[str, str] | None:
    """(field, why) when no live worker takes this stage of a run with `config` on its backend and GPU
    count (runs.pipeline.dispatch.routing.ROUTED_STAGES) and can run it there, or, for a GPU backend loading the target,
    hold its weights; None when one can. `options`: runs.fleet.selectors.launch_options for `live`."""
    backend_key, gpus_key = backend_field(stage_name), gpus_field(stage_name)
    if problem := stage_problem(stage_name=stage_name, config=config):
        return backend_key or gpus_key, f"{backend_key or gpus_key}: {problem}; no worker takes it"
    name, gpus = stage_backend(stage_name=stage_name, config=config)
    why = _choice_reason(options[name], gpus=gpus, live=live)
    if why is None and weight_bytes and memory_judged(stage_name=stage_name, backend=name, gpus=gpus):
        reason = _memory_reason(live=live, backend=name, gpus=gpus, weight_bytes=weight_bytes)
        why = ("gpus", reason) if reason else None
    if why is None:
        return None
    at_fault, reason = why
    if at_fault == "backend" and backend_key:
        return backend_key, f"{backend_key} {name}: {reason}"
    needs = stage_needs(stage_name=stage_name, backend=name, gpus=gpus)
    return gpus_key, f"{gpus_key} {gpus}: {needs + ': ' if needs else ''}{reason}"


def nodes_refusal(*, config: dict, live: list[Worker]) -> tuple[str, str] | None:
    """("train_nodes", why) when fewer live workers take the training's queue and can run it than the
    run's train_nodes (each worker holds one rank: workers.stages.train.processes.nodes); None when enough do."""
    nodes = int(config.get("train_nodes") or 1)
    if nodes <= 1:
        return None
    backend, gpus = stage_backend(stage_name="train", config=config)
    able = sorted(w.name for w in live if worker_unfit(w, backend=backend, gpus=gpus) is None)
    if len(able) >= nodes:
        return None
    known = BACKENDS_BY_NAME.get(backend)
    return "train_nodes", (f"train_nodes {nodes}: each rank needs its own live worker taking "
                           f"{stage_queue(backend=backend, gpus=gpus)} that runs {known.label if known else backend} "
                           f"on {gpus_text(gpus)}, and {len(able)} {'does' if len(able) == 1 else 'do'}"
                           f"{' (' + ', '.join(able) + ')' if able else ''}: start more workers or ask for fewer nodes")


def host_refusals(*, config: RunConfig, weight_bytes: int | None = None) -> list[tuple[str, str]]:
    """(field, why) for each backend choice of `config` this host cannot run, by its own probe
    (workers.contract.host.backends.backend_require, as a stage does at start); empty when it can run them.
    Measuring acceptance counts too: it runs Transformers on the extraction's GPU count here. The live
    workers do not matter: none of them will run these stages. `weight_bytes` (the target's, None when
    unknown): a GPU backend loading the target must find it room on this host's GPUs."""
    refusals: list[tuple[str, str]] = []
    for stage_name in ROUTED_STAGES:
        backend_key, gpus_key = backend_field(stage_name), gpus_field(stage_name)
        if said_already(refusals, stage_name=stage_name, field=gpus_key):
            continue
        name, gpus = stage_backend(stage_name=stage_name, config=config.as_dict())
        needs = stage_needs(stage_name=stage_name, backend=name, gpus=gpus)
        needs = f"{needs}: " if needs else ""
        try:
            backend_require(name=name, gpus=gpus)
        except BackendUnavailable as exc:
            # The GPU count is at fault when this host runs the backend on one GPU (or the CPU), or
            # when the run did not choose the backend.
            if backend_key is None or BACKENDS_BY_NAME[name].probe(1) is None:
                refusals.append((gpus_key, f"{gpus_key} {gpus}: {needs}{exc}"))
            else:
                refusals.append((backend_key, f"{backend_key} {name}: {exc}"))
            continue
        if weight_bytes and memory_judged(stage_name=stage_name, backend=name, gpus=gpus):
            if runs_on_cpu({"vllm": this_host.vllm_description()}, backend=name):
                memory = this_host.host_memory_bytes()
            else:
                memory = gpu_memory_bytes([gpu.memory_bytes for gpu in this_host.detect_gpus()], gpus=gpus)
            if not holds(memory_bytes=memory, weight_bytes=weight_bytes):
                refusals.append((gpus_key, f"{gpus_key} {gpus}: {needs}" + too_large(
                    weight_bytes=weight_bytes, label=BACKENDS_BY_NAME[name].label, gpus=gpus,
                    where=f"this host ({socket.gethostname()})", memory_bytes=memory)))
    return refusals


def serve_check_refusal(*, config: RunConfig, live: list[Worker] | None) -> tuple[str, str] | None:
    """("serve_check", why) when a run asks for a serve check that nobody could run: no live worker
    taking vLLM's queue (`live`), or, for a run in this process (live None), no vLLM on this host."""
    if not config.serve_check:
        return None
    gpus = config.tensor_parallel_size if config.extraction_backend == "vllm" else 1
    if live is None:
        try:
            backend_require(name="vllm", gpus=gpus)
        except BackendUnavailable as exc:
            return "serve_check", f"serve_check: {exc}"
        return None
    if any(worker_unfit(w, backend="vllm", gpus=gpus) is None for w in live):
        return None
    queue = stage_queue(backend="vllm", gpus=gpus)
    return "serve_check", (f"serve_check: no live worker takes {queue} (vLLM on {gpus_text(gpus)}): start a worker "
                           "where `make vllm` ran, or launch without the serve check")
