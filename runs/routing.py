"""Where each stage of a run is sent: the queue follows the run's backend and GPU count for
extraction and training (workers.stages.backends.stage_queue), the stage's own queue otherwise."""
from __future__ import annotations

from runs.pipeline import STAGES_BY_NAME
from runs.run_config import RunConfig
from workers.stages.backends import stage_queue as backend_queue

# (backend setting, GPU-count setting) of the stages whose queue a run chooses.
BACKEND_SETTINGS = {
    "extract": ("extraction_backend", "tensor_parallel_size"),
    "train": ("training_backend", "train_gpus"),
}


def stage_backend(*, stage_name: str, config: dict) -> tuple[str, int] | None:
    """(backend, GPUs) a run's stage runs with; None for a stage that has no backend to choose.
    A run launched before backends were chosen has neither key: it ran on the defaults."""
    if stage_name not in BACKEND_SETTINGS:
        return None
    backend_key, gpus_key = BACKEND_SETTINGS[stage_name]
    return (config.get(backend_key) or getattr(RunConfig, backend_key),
            int(config.get(gpus_key) or getattr(RunConfig, gpus_key)))


def stage_queue(*, stage_name: str, config: dict) -> str:
    chosen = stage_backend(stage_name=stage_name, config=config)
    if chosen is None:
        return STAGES_BY_NAME[stage_name].queue
    backend, gpus = chosen
    return backend_queue(backend=backend, gpus=gpus)
