"""Reads of reports: the list, one report and its versions, and what each embedded block shows (the runs
a chart or table names, their table cells, their curves for the export, whether a checkpoint exists).

Every signed-in user may read every report (as every run): a report's link is how it is shared."""
from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from runs.checkpoints.models import Checkpoint
from runs.pipeline.models import PipelineRun
from runs.reports.models import Report, ReportVersion
from runs.pipeline import selectors as run_selectors
from runs.pipeline.status.run_status import run_status
from runs.projects import access
from runs.reports.directives import SETTING_COLUMNS
from runs.tracking import curves
from runs.tracking.curves import CurveQuery

# Points per series a chart of the export holds (its SVG path); the page asks the API for its own.
EXPORT_POINTS = 400
MAX_ID = 2**63 - 1


def report_list() -> QuerySet[Report]:
    return Report.objects.select_related("author").order_by("-updated_at", "-id")


def report_get(*, pk: int) -> Report:
    if pk > MAX_ID:
        raise Http404(f"no report {pk}")
    return get_object_or_404(Report.objects.select_related("author"), pk=pk)


def report_version(*, report: Report, number: int | None = None) -> ReportVersion:
    """The report's version `number`, its newest when None; 404 naming the version when there is none."""
    versions = ReportVersion.objects.select_related("saved_by").filter(report=report)
    version = (versions.order_by("-number").first() if number is None
               else versions.filter(number=number).first() if number <= MAX_ID else None)
    if version is None:
        raise Http404(f"report {report.pk} has no version {number}" if number is not None
                      else f"report {report.pk} has no version")
    return version


def report_versions(*, report: Report) -> QuerySet[ReportVersion]:
    return (ReportVersion.objects.select_related("saved_by").filter(report=report)
            .only("number", "title", "created_at", "saved_by__username", "report_id").order_by("-number"))


def may_edit(*, user, report: Report) -> bool:
    """Its author and staff edit a report; everyone signed in reads it."""
    return user.is_authenticated and (report.author_id == user.pk or user.is_staff)


# --- what the blocks show -------------------------------------------------------------------------------

def block_runs(*, ids: set[int], user=None) -> dict[int, PipelineRun]:
    """The runs the report's blocks name, with what a table shows of them (status, τ, best epoch) and their
    config: one read for every block of a report. Ids with no run are simply absent, and so, with `user`,
    are runs of projects the reader does not see: a report is shared by its link, its runs are not."""
    ids = {pk for pk in ids if pk <= MAX_ID}
    rows = run_selectors.run_rows().filter(pk__in=ids)
    runs = {run.pk: run for run in (access.runs_visible(rows, user) if user is not None else rows)}
    configs = dict(PipelineRun.objects.filter(pk__in=list(runs)).values_list("pk", "config"))
    for pk, run in runs.items():
        run.report_config = configs.get(pk) or {}
    return runs


def table_cell(run: PipelineRun, column: str) -> str:
    """A table block's cell, as text ("" for a value the run does not have)."""
    training = getattr(run, "training_run", None)
    if column == "name":
        return str(run)
    if column == "status":
        return run_status(run)
    if column == "owner":
        return run.owner.get_username()
    if column == "created":
        return run.created_at.strftime("%Y-%m-%d %H:%M")
    if column == "tau":
        return "" if run.shown_tau is None else f"{run.shown_tau:.2f}"
    if column == "best_epoch":
        # Counted from 1, as every page counts epochs (best_epoch is the checkpoint's 0-based index).
        return "" if training is None or training.best_epoch is None else str(training.best_epoch + 1)
    if column == "epochs":
        return "" if training is None else str(training.epochs)
    if column == "target":
        return run.target.name if run.target_id else ""
    if column == "dataset":
        return run.dataset.name if run.dataset_id else ""
    value = run.report_config.get(SETTING_COLUMNS[column])
    if value is None:
        return ""
    return ", ".join(map(str, value)) if isinstance(value, list) else f"{value:g}" if isinstance(value, float) else str(value)


def run_metric_keys(*, runs: list[PipelineRun]) -> dict[int, set[str]]:
    """Each run's series as "split:key", in one query (a chart says which runs lack its metric)."""
    trainings = {getattr(run, "training_run", None).pk: run.pk for run in runs
                 if getattr(run, "training_run", None) is not None}
    out: dict[int, set[str]] = {run.pk: set() for run in runs}
    for training_id, series in curves.run_series_summaries(training_run_ids=list(trainings)).items():
        out[trainings[training_id]] = {f"{s['split']}:{s['key']}" for s in series}
    return out


def chart_series(*, run: PipelineRun, keys: list[str], split: str) -> list[dict]:
    """A run's series of a chart (its metric's keys), downsampled for the export's drawing."""
    training = getattr(run, "training_run", None)
    if training is None or not keys:
        return []
    query = CurveQuery(keys=tuple(keys), split=split, points=EXPORT_POINTS)
    return [{"key": s["key"], "split": s["split"], "steps": s["steps"], "values": s["values"]}
            for s in curves.curve_window(training_run_id=training.pk, query=query)]


def checkpoints_existing(*, ids: set[int], user=None) -> set[int]:
    """The ids that are checkpoints (with `user`: ones the reader sees, runs.projects.access)."""
    checkpoints = Checkpoint.objects.filter(pk__in=[pk for pk in ids if pk <= MAX_ID])
    if user is not None:
        checkpoints = access.checkpoints_visible(checkpoints, user)
    return set(checkpoints.values_list("pk", flat=True))


def generations_for_export(*, checkpoint_id: int, prompts: int) -> dict:
    """A checkpoint's recorded generations, its first `prompts` prompts (what the generations API answers)."""
    # Imported here: only an export with a generations block needs the generations part.
    from runs.checkpoints.generation_selectors import checkpoint_generations

    checkpoint = Checkpoint.objects.select_related("training_run__run").get(pk=checkpoint_id)
    answer = checkpoint_generations(checkpoint=checkpoint)
    return {**answer, "prompts": answer["prompts"][:prompts]}
