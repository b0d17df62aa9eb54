"""What the pipeline announces, so that the domains above it (alerts, sweeps) react without the
pipeline knowing them: Django signals, whose receivers are connected in RunsConfig.ready
(runs/apps.py). Each is sent inside the transaction that recorded the event, so what a receiver
writes commits, or rolls back, with it. The sender is PipelineRun."""
from __future__ import annotations

from django.dispatch import Signal

# A stage of a run failed (not cancelled), or a run trained elsewhere ended failed.
# Arguments: run_id, stage_name, error.
run_failed = Signal()

# A run is over: its last stage succeeded, a stage failed, or it was cancelled. Argument: run_id.
run_over = Signal()

# A running stage's worker stopped renewing its lease (the reconciler found it lapsed).
# Arguments: stage_name, record_id, run_id (None for a job outside a run), worker, attempt.
worker_lost = Signal()

# A run's evaluation recorded its τ. Argument: run_id.
tau_recorded = Signal()
