"""A run that is over lets its sweep hand its next waiting run to the queue (runs.sweeps.release):
connected to runs.pipeline.lifecycle.signals.run_over by RunsConfig.ready."""
from __future__ import annotations

from runs.pipeline.lifecycle import signals as pipeline_signals
from runs.sweeps.release import sweep_release_after


def _run_over(sender, *, run_id, **_):
    sweep_release_after(run_id=run_id)


def connect() -> None:
    pipeline_signals.run_over.connect(_run_over, dispatch_uid="sweeps.run_over")
