"""Where each stage of a run is sent: the queue follows the run's backend and GPU count for
extraction and training (workers.stages.backends.stage_queue), the stage's own queue otherwise."""
from __future__ import annotations

from runs.pipeline import STAGES_BY_NAME
from runs.run_config import RunConfig
from workers.stages.backends import BACKENDS_BY_NAME, MAX_GPUS
from workers.stages.backends import stage_queue as backend_queue

# (backend setting, GPU-count setting) of the stages whose queue a run chooses.
BACKEND_SETTINGS = {
    "extract": ("extraction_backend", "tensor_parallel_size"),
    "train": ("training_backend", "train_gpus"),
}


def _gpu_count(value: object, default: int) -> int:
    """A stored GPU count as an int; 0 (which no queue of a real worker carries) when it is not a
    whole number, so that a bad value read back is shown, never raised (see stage_problem)."""
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


def stage_backend(*, stage_name: str, config: dict) -> tuple[str, int] | None:
    """(backend, GPUs) a run's stage runs with; None for a stage that has no backend to choose.
    A run launched before backends were chosen has neither key: it ran on the defaults.
    Never raises: a config edited outside the launch checks (stage_problem says what is wrong with it)
    must not take down the pages that list runs and queues."""
    if stage_name not in BACKEND_SETTINGS:
        return None
    backend_key, gpus_key = BACKEND_SETTINGS[stage_name]
    return (str(config.get(backend_key) or getattr(RunConfig, backend_key)),
            _gpu_count(config.get(gpus_key), getattr(RunConfig, gpus_key)))


def stage_problem(*, stage_name: str, config: dict) -> str:
    """Why no worker can ever take this stage of a run, whatever the fleet: an unknown backend or a GPU
    count out of range, which only a config changed after its launch can hold; "" when none."""
    chosen = stage_backend(stage_name=stage_name, config=config)
    if chosen is None:
        return ""
    backend, gpus = chosen
    if backend not in BACKENDS_BY_NAME:
        return f"unknown backend {backend[:60]!r}"
    if not 1 <= gpus <= MAX_GPUS:
        gpus_key = BACKEND_SETTINGS[stage_name][1]
        return f"{gpus_key} {str(config.get(gpus_key))[:60]!r} is not a GPU count from 1 to {MAX_GPUS}"
    return ""


def stage_queue(*, stage_name: str, config: dict) -> str:
    chosen = stage_backend(stage_name=stage_name, config=config)
    if chosen is None:
        return STAGES_BY_NAME[stage_name].queue
    backend, gpus = chosen
    return backend_queue(backend=backend, gpus=gpus)
