"""Where each stage of a run is sent: the queue follows the run's backend and GPU count for
extraction and training (workers.contract.host.backends.stage_queue), the extraction's GPU count for
measuring acceptance, the stage's own queue otherwise."""
from __future__ import annotations

from runs.pipeline.online.selectors import train_capture_queue
from runs.pipeline.lifecycle.stages import STAGES, STAGES_BY_NAME
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.host.backends import BACKENDS_BY_NAME, MAX_GPUS
from workers.contract.host.backends import stage_queue as backend_queue

# (backend setting, GPU-count setting) of the stages whose backend a run chooses on the launch form.
BACKEND_SETTINGS = {
    "extract": ("extraction_backend", "tensor_parallel_size"),
    "train": ("training_backend", "train_gpus"),
}
# (fixed backend, GPU-count setting) of the stages whose backend is not chosen but whose GPU count
# follows a run's setting. Measuring acceptance runs our own speculative decoding with Transformers,
# so it loads the whole target again: a target that needed 4 GPUs to extract needs them there too.
DERIVED_SETTINGS = {
    "evaluate": ("transformers", "tensor_parallel_size"),
}
# Every stage of a run whose queue follows its config, in pipeline order.
ROUTED_STAGES = tuple(s.name for s in STAGES if s.name in BACKEND_SETTINGS or s.name in DERIVED_SETTINGS)


def _gpu_count(value: object, default: int) -> int:
    """A stored GPU count as an int; 0 (which no queue of a real worker carries) when it is not a
    whole number, so that a bad value read back is shown, never raised (see stage_problem)."""
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


def backend_field(stage_name: str) -> str | None:
    """The setting that names this stage's backend; None when the backend is fixed (or none)."""
    return BACKEND_SETTINGS[stage_name][0] if stage_name in BACKEND_SETTINGS else None


def gpus_field(stage_name: str) -> str | None:
    """The setting that gives this stage's GPU count; None for a stage that runs on one device."""
    settings = BACKEND_SETTINGS.get(stage_name) or DERIVED_SETTINGS.get(stage_name)
    return settings[1] if settings else None


def stage_backend(*, stage_name: str, config: dict) -> tuple[str, int] | None:
    """(backend, GPUs) a run's stage runs with; None for a stage that has no backend to choose.
    A run launched before backends were chosen has neither key: it ran on the defaults.
    Never raises: a config edited outside the launch checks (stage_problem says what is wrong with it)
    must not take down the pages that list runs and queues."""
    if stage_name in DERIVED_SETTINGS:
        backend, gpus_key = DERIVED_SETTINGS[stage_name]
        return backend, _gpu_count(config.get(gpus_key), getattr(RunConfig, gpus_key))
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
        gpus_key = gpus_field(stage_name)
        return f"{gpus_key} {str(config.get(gpus_key))[:60]!r} is not a GPU count from 1 to {MAX_GPUS}"
    return ""


def stage_queue(*, stage_name: str, config: dict) -> str:
    """The queue of a run's stage. A standalone evaluation (a checkpoint's "Measure acceptance") has
    no run, so no config: the defaults give "gpu", where runs.pipeline.dispatch.queue sends it."""
    if stage_name == "train" and (capture := train_capture_queue(config)):
        return capture  # an online run's training starts vLLM capture servers beside the trainer
    chosen = stage_backend(stage_name=stage_name, config=config)
    if chosen is None:
        return STAGES_BY_NAME[stage_name].queue
    backend, gpus = chosen
    return backend_queue(backend=backend, gpus=gpus)
