"""The alerts' ears: the events the pipeline and the curves announce (runs.pipeline.lifecycle.signals,
runs.tracking.signals) reach the alert checks (runs.alerts.events), which never raise. Connected once,
by RunsConfig.ready."""
from __future__ import annotations

from runs.alerts import events
from runs.pipeline.lifecycle import signals as pipeline_signals
from runs.tracking import signals as tracking_signals


def _run_failed(sender, *, run_id, stage_name, error, **_):
    events.run_failed(run_id=run_id, stage_name=stage_name, error=error)


def _worker_lost(sender, *, stage_name, record_id, run_id, worker, attempt, **_):
    events.worker_lost(stage_name=stage_name, record_id=record_id, run_id=run_id, worker=worker, attempt=attempt)


def _tau_recorded(sender, *, run_id, **_):
    events.tau_recorded(run_id=run_id)


def _metrics_recorded(sender, *, training_run_id, points, **_):
    events.metrics_recorded(training_run_id=training_run_id, points=points)  # a loss that went NaN


def connect() -> None:
    pipeline_signals.run_failed.connect(_run_failed, dispatch_uid="alerts.run_failed")
    pipeline_signals.worker_lost.connect(_worker_lost, dispatch_uid="alerts.worker_lost")
    pipeline_signals.tau_recorded.connect(_tau_recorded, dispatch_uid="alerts.tau_recorded")
    tracking_signals.metrics_recorded.connect(_metrics_recorded, dispatch_uid="alerts.metrics_recorded")
