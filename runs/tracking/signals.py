"""What the curves announce, for the domains above them (alerts' rules) to react to: a Django
signal connected in RunsConfig.ready (runs/apps.py), sent inside the transaction that stored the
points. The sender is MetricSeries."""
from __future__ import annotations

from django.dispatch import Signal

# A batch of a training's metric points made a loss series NaN or infinite (sent then, not per batch).
# Arguments: training_run_id, points (the batch's first such point, as reported).
metrics_recorded = Signal()
