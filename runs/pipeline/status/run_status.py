"""A run's status in one word, derived from its stages' (and, for a sweep's run, its sweep's): the pages, the API,
the CLI and the runs list's SQL (runs.tracking.runs_list.run_table) all follow these rules."""
from __future__ import annotations

from collections.abc import Callable

from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageRecord, StageStatus
from runs.pipeline.lifecycle.stages import STAGES


EXTERNAL_TRAIN_LABEL = "Train draft (elsewhere)"


def run_stages(run: PipelineRun) -> list[tuple[str, str, StageRecord]]:
    """(name, label, row) of each stage the run has: the five of a pipeline run, the training alone of a run
    trained elsewhere (runs.pipeline.launch.external)."""
    if run.external:
        return [("train", EXTERNAL_TRAIN_LABEL, run.training_run)]
    return [(stage.name, stage.label, getattr(run, stage.related_name)) for stage in STAGES]


# The whole run's status from its stages': the first rule that holds (any stage, or every stage, has
# that status), else RUN_STATUS_OTHERWISE. run_table.with_columns writes the same rules in SQL.
RUN_STATUS_RULES = ((any, StageStatus.FAILED), (any, StageStatus.CANCELLED),
                    (all, StageStatus.SUCCEEDED), (all, StageStatus.QUEUED))
RUN_STATUS_OTHERWISE = StageStatus.RUNNING


# A run of a sweep that its sweep has not handed to the queues yet (runs.sweeps.release): every stage
# queued and its SweepRun's released_at null. A run status, not a stage's; run_table words it in SQL too.
RUN_HELD = "held"
RUN_STATUSES = [*(s.value for s in StageStatus), RUN_HELD]


def _sweep_entry(run: PipelineRun):
    """The run's SweepRun (and its sweep), or None: joined by run_list() and run_rows(), else one query."""
    try:
        return run.sweep_entry
    except PipelineRun.sweep_entry.RelatedObjectDoesNotExist:
        return None


def run_status(run: PipelineRun) -> str:
    """One word for the whole run, derived from its stages (and, for a sweep's run not yet handed to the
    queues, its sweep: RUN_HELD). The pages, the API and the CLI all read it from here."""
    def held() -> bool:  # asked only of a queued run: the sweep entry may cost a query where it is not joined
        entry = _sweep_entry(run)
        return entry is not None and entry.released_at is None

    return status_of([record.status for _, _, record in run_stages(run)], external=run.external, held=held)


def status_of(statuses: list[str], *, external: bool, held: Callable[[], bool]) -> str:
    """run_status's rules over the stages' statuses, for rows read as values (runs.tracking.runs_list.run_table.listed_runs).
    `held()`: whether the run is a sweep's that its sweep has not handed to the queues yet."""
    for quantifier, status in RUN_STATUS_RULES:
        if quantifier(s == status for s in statuses):
            if status == StageStatus.QUEUED and not external and held():
                return RUN_HELD
            return status
    return RUN_STATUS_OTHERWISE


def run_status_reason(run: PipelineRun, status: str | None = None) -> str:
    """Why the run waits, in words ("held: its sweep runs at most 2 at once"); "" when there is nothing to
    say. `status` when the caller has it already (run_status's)."""
    status = status or run_status(run)
    return status_reason_of(status, sweep_parallel=_sweep_entry(run).sweep.parallel if status == RUN_HELD else None)


def status_reason_of(status: str, *, sweep_parallel: int | None) -> str:
    """run_status_reason's words, from the status and the holding sweep's `parallel`."""
    return f"{RUN_HELD}: its sweep runs at most {sweep_parallel} at once" if status == RUN_HELD else ""


def run_is_finished(run: PipelineRun) -> bool:
    return all(record.is_finished for _, _, record in run_stages(run))
