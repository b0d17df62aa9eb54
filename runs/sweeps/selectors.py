"""Reads of sweeps: the list, one sweep's runs with their swept settings, status and tau, the best run,
and the launch form's values for "launch the best again with more data"."""
from __future__ import annotations

import math
from dataclasses import dataclass

from django.db.models import BooleanField, Count, ExpressionWrapper, F, Min, QuerySet, Value
from django.urls import reverse

from runs.checkpoints.models import Checkpoint
from runs.pipeline.models import PipelineRun, TrainingRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.sweeps.models import Sweep, SweepRun
from runs.pipeline import selectors as run_selectors
from runs.pipeline.status.run_status import run_status
from runs.pipeline.launch.setting_bounds import MAX_SAMPLES
from runs.projects.access import visible_q

# Two taus equal to this many decimals (as the pages show them) are a tie.
TAU_DECIMALS = 3


def sweep_list(*, user=None) -> QuerySet[Sweep]:
    """Sweeps, newest first, with `run_count`: their runs `user` sees (None: all), and `hidden_count`: the
    others (runs staff moved to a project the user does not see); a sweep of which the user sees no run
    is left out (as runs.projects.selectors.sweep_visible_check answers it 404)."""
    seen = visible_q(user, run="entries__run__") if user is not None else None
    sweeps = (Sweep.objects.select_related("owner")
              .annotate(run_count=Count("entries", filter=seen), every_count=Count("entries"))
              .annotate(hidden_count=F("every_count") - F("run_count")).order_by("-created_at", "-id"))
    return sweeps if seen is None else sweeps.filter(run_count__gt=0)


def sweep_get(*, pk: int, user) -> Sweep:
    """A sweep the user sees one run of (staff: any); 404 otherwise, in the words of one that does not exist
    (runs.projects.selectors.sweep_visible_check, through runs.projects.access)."""
    from runs.projects import access

    return access.visible_or_404("sweep", pk, user, rows=Sweep.objects.select_related("owner"))


@dataclass
class SweepRow:
    position: int
    run: PipelineRun
    settings: dict[str, str]  # swept key -> value as typed
    status: str  # the run's status ("held" while its sweep holds it back: run_status)
    tau: float | None  # measured acceptance length, once its evaluate stage succeeded
    is_best: bool = False
    # Beside τ, what tells a sweep's runs apart before and besides acceptance: the lowest validation loss
    # of its checkpoints so far, and its training's tokens per second.
    val_loss: float | None = None
    tokens_per_s: float | None = None

    def as_dict(self) -> dict:
        return {"position": self.position, "run_id": self.run.pk, "name": str(self.run),
                "url": self.run.get_absolute_url(), "settings": self.settings, "status": self.status,
                "tau": self.tau, "is_best": self.is_best, "val_loss": self.val_loss, "tokens_per_s": self.tokens_per_s}


@dataclass
class SweepBest:
    """The run with the highest measured tau; on a tie (equal to TAU_DECIMALS) the earliest of the sweep,
    with the others it ties with. Runs not measured (queued, running, failed) are not candidates:
    `measured` of `total` says how many were, and the best is "so far" until every run finished."""

    row: SweepRow | None
    tied_with: list[SweepRow]
    measured: int
    total: int
    finished: bool
    hidden: int = 0  # runs of the sweep in projects the viewer does not see: left out of the rest


def sweep_rows(*, sweep: Sweep, user=None) -> tuple[list[SweepRow], SweepBest]:
    """The sweep's runs in its order with the best of them; `user`: only the runs of projects they see
    (their count left out is `hidden`), the best, the counts and `finished` of those (None: every run)."""
    seen = visible_q(user, run="run__") if user is not None else None
    # Every entry with whether the user sees its run, in one query: the seen ones shown, the others counted.
    listed = list(SweepRun.objects.filter(sweep=sweep).order_by("position").annotate(
        seen=Value(True) if seen is None else ExpressionWrapper(seen, output_field=BooleanField()))
        .values_list("position", "run_id", "values", "seen"))
    entries = [entry[:3] for entry in listed if entry[3]]
    runs = {run.pk: run for run in run_selectors.run_rows().filter(pk__in=[e[1] for e in entries])}
    # One query for every run's lowest validation loss; a NaN loss (a diverged validation) is left out by the
    # database itself: SQLite stores NaN as NULL, which MIN skips, and PostgreSQL orders NaN above every number,
    # so MIN is NaN only where every loss is (shown as none). Comparing with NaN in SQL instead matched no row
    # on SQLite, where `val_loss = NULL` is never true, and `.exclude()` then dropped every checkpoint.
    val_losses = {run_id: low for run_id, low in Checkpoint.objects.filter(training_run__run_id__in=list(runs))
                  .values("training_run__run_id").annotate(low=Min("val_loss"))
                  .values_list("training_run__run_id", "low") if low is not None and not math.isnan(low)}
    speeds = dict(TrainingRun.objects.filter(run_id__in=list(runs)).values_list("run_id", "tokens_per_second"))
    rows = []
    for position, run_id, values in entries:
        run = runs[run_id]
        status = run_status(run)
        tau = run.shown_tau  # its best checkpoint's (runs.pipeline.best), else its evaluate stage's
        # In the sweep's order of keys: a JSON object column (jsonb) keeps no order of its own.
        settings = {key: values.get(key, "") for key in sweep.keys}
        rows.append(SweepRow(position=position, run=run, settings=settings, status=status, tau=tau,
                             val_loss=val_losses.get(run_id), tokens_per_s=speeds.get(run_id)))
    measured = [row for row in rows if row.tau is not None]
    best, tied = None, []
    if measured:
        top = max(round(row.tau, TAU_DECIMALS) for row in measured)
        at_top = [row for row in measured if round(row.tau, TAU_DECIMALS) == top]  # in sweep order
        best, tied = at_top[0], at_top[1:]
        best.is_best = True
    finished = all(row.status in (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED) for row in rows)
    return rows, SweepBest(row=best, tied_with=tied, measured=len(measured), total=len(rows), finished=finished,
                           hidden=len(listed) - len(entries))


def sweep_summary(*, sweep: Sweep, user=None, rows: tuple[list[SweepRow], SweepBest] | None = None) -> dict:
    """The sweep as JSON: what launch_sweep prints and the sweep page polls (`user`: as sweep_rows; `rows`:
    what sweep_rows already answered, not asked again)."""
    rows, best = rows if rows is not None else sweep_rows(sweep=sweep, user=user)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return {
        "sweep_id": sweep.pk, "name": sweep.name, "mode": sweep.mode, "parallel": sweep.parallel,
        "url": sweep.get_absolute_url(), "keys": sweep.keys, "varied": dict(sweep.varied),
        "run_ids": [row.run.pk for row in rows], "runs": [row.as_dict() for row in rows], "statuses": counts,
        "best": {"run_id": best.row.run.pk, "tau": best.row.tau, "settings": best.row.settings,
                 "tied_with": [row.run.pk for row in best.tied_with]} if best.row else None,
        "measured": best.measured, "finished": best.finished, "hidden_runs": best.hidden,
        "again_url": best_again_url(run_id=best.row.run.pk) if best.row else None,
    }


def sweep_of_run(*, run_id: int) -> Sweep | None:
    entry = SweepRun.objects.select_related("sweep").filter(run_id=run_id).first()
    return entry.sweep if entry else None


def compare_link(rows: list[SweepRow]) -> tuple[str, int] | None:
    """The compare page for a sweep's runs, and how many it shows: all of them, or when there are more than
    compare takes, the highest τ first (then the unmeasured, in the sweep's order). None under two runs."""
    from runs.tracking.comparison import MAX_RUNS, MIN_RUNS

    if len(rows) < MIN_RUNS:
        return None
    ranked = sorted(rows, key=lambda row: (row.tau is None, -(row.tau or 0.0), row.position))[:MAX_RUNS]
    ids = [row.run.pk for row in sorted(ranked, key=lambda row: row.position)]
    return f"{reverse('runs:run_compare')}?ids={','.join(map(str, ids))}", len(ids)


def best_again_url(*, run_id: int) -> str:
    return f"{reverse('runs:run_launch')}?copy={run_id}&more_data=1"


def more_data_initial(*, run_id: str, user) -> tuple[dict, str] | None:
    """The launch form's values for "launch the best again with more data": a copy of the run's settings
    with twice its max_samples (a run that read every conversation keeps them all: the note asks for
    another dataset), and a note that says what changed. None when there is no such run the user sees."""
    initial = run_selectors.launch_copy_initial(run_id=run_id, user=user)
    if initial is None:
        return None
    run = PipelineRun.objects.select_related("dataset").get(pk=int(run_id))
    sweep = sweep_of_run(run_id=run.pk)
    of_sweep = f", the best of sweep {sweep.name}" if sweep else ""
    before = initial.get("max_samples")
    if before:
        initial["max_samples"] = more = min(before * 2, MAX_SAMPLES)
        note = f"Prefilled from {run}{of_sweep}: max_samples {before:,} → {more:,}. Or choose another dataset below."
    else:
        note = (f"Prefilled from {run}{of_sweep}: it already trained on every conversation of {run.dataset.name}; "
                "choose a larger dataset below.")
    initial["name"] = f"{run} with more data"[:200]
    return initial, note
