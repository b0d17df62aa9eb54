"""A run's system series: what its workers sampled (CPU, memory, GPU, disk) while they ran its stages.

They live in the run's metric store beside its training curves (runs.tracking.models), under the split
SYSTEM_SPLIT and keys starting "system/" (e.g. system/cpu_percent, system/gpu0_util_percent). A point's
step is its wall-clock time in milliseconds: the stages of a run run one after another, so the samples
of all of them make one series ordered in time, and the run page draws them against time
(static/js/runs/curves.js, "System"). A training's steps mean nothing to them: the curve reads for lists,
compare and the default curves query leave them out, and a resumed training's truncation keeps them."""
from __future__ import annotations

from runs.pipeline.models import TrainingRun
from runs.pipeline.lifecycle.stages import STAGES_BY_NAME

SYSTEM_SPLIT = "system"
SYSTEM_PREFIX = "system/"


def system_series_owner(*, stage_name: str, record_id: int) -> int | None:
    """The training row whose metric store takes the samples of this stage row: its run's; None for a
    job or a checkpoint's own measurement (no run of theirs: the workers page still shows the worker's now)."""
    kind = STAGES_BY_NAME.get(stage_name)
    if kind is None or kind.is_job:
        return None
    run_id = kind.model.objects.filter(pk=record_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return None
    return TrainingRun.objects.filter(run_id=run_id).values_list("pk", flat=True).first()
