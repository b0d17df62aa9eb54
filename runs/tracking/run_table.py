"""The runs list as a tracker shows it: searchable, filterable, sortable, paginated, every column
computed in the list's own query (status, duration, best validation loss, tau), never per row. The query's
parameters are read and checked in runs.tracking.run_filters, its search in runs.tracking.run_search."""
from __future__ import annotations

from datetime import timedelta

import math

from django.contrib.auth import get_user_model
from django.core.paginator import Page, Paginator
from django.db.models import (Case, CharField, Count, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet,
                              Subquery, Value, When, Window)
from django.db.models.functions import Coalesce, Now

from runs.checkpoints.models import Checkpoint
from runs.data.models import Dataset, TargetModel
from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.projects.models import Project
from runs.pipeline.lifecycle.stages import STAGES
from runs.tracking.run_search import searched, setting_match, tagged_run_ids
from runs.pipeline.selectors import run_rows
from runs.pipeline.status.run_status import (RUN_HELD, RUN_STATUS_OTHERWISE, RUN_STATUS_RULES, run_status,
                                             run_status_reason)
# The parameters' names, the filters and their refusal: the callers of the list read them here too.
from runs.tracking.run_filters import (  # noqa: F401
    ARCHIVED,
    COLUMN_KEYS,
    COLUMNS,
    PARAMS,
    SETTING_FIELDS,
    SETTING_PREFIX,
    SORTS,
    STATUSES,
    RunFilters,
    RunTableError,
    settings_text,
)

PAGE_SIZE = 50
# The default order, newest first, as the index run_newest keeps it (migration 0024).
ORDER_NEWEST = F("created_at").desc()
MAX_CHOICES = 500  # entries of a filter menu; the search box finds the rest


def _any_stage(status: str) -> Q:
    q = Q()
    for stage in STAGES:
        q |= Q(**{f"{stage.related_name}__status": status})
    return q


def _every_stage(status: str) -> Q:
    q = Q()
    for stage in STAGES:
        q &= Q(**{f"{stage.related_name}__status": status})
    return q


def _durations(queryset: QuerySet[PipelineRun]) -> QuerySet[PipelineRun]:
    first, last = STAGES[0].related_name, STAGES[-1].related_name
    # A run trained elsewhere has its training alone: from its start to its end.
    return queryset.annotate(duration=ExpressionWrapper(
        Coalesce(F(f"{last}__finished_at"), F("training_run__finished_at"), Now())
        - Coalesce(F(f"{first}__started_at"), F("training_run__started_at")), output_field=DurationField()))


def _best_val_loss(queryset: QuerySet[PipelineRun]) -> QuerySet[PipelineRun]:
    best = Checkpoint.objects.filter(training_run=OuterRef("training_run"), val_loss__isnull=False).order_by("val_loss")
    return queryset.annotate(best_val_loss=Subquery(best.values("val_loss")[:1]))


def _shown_columns(queryset: QuerySet[PipelineRun]) -> QuerySet[PipelineRun]:
    """Duration and best validation loss of the page's rows; status comes from their stages."""
    return _best_val_loss(_durations(queryset))


def with_columns(queryset: QuerySet[PipelineRun]) -> QuerySet[PipelineRun]:
    """Status as runs.pipeline.status.run_status words it, duration, best validation loss; in SQL."""
    return _shown_columns(queryset).annotate(
        status=Case(
            When(external=True, then=F("training_run__status")),  # its one stage's status (run_status)
            # Every stage queued and its sweep not yet handing it over (run_status's RUN_HELD).
            When(_every_stage(StageStatus.QUEUED) & Q(sweep_entry__isnull=False, sweep_entry__released_at__isnull=True),
                 then=Value(RUN_HELD)),
            *(When((_any_stage if quantifier is any else _every_stage)(status), then=Value(status.value))
              for quantifier, status in RUN_STATUS_RULES),
            default=Value(RUN_STATUS_OTHERWISE.value), output_field=CharField()))


def _page_ids(ordered: QuerySet[PipelineRun], number: int, *, newest: bool) -> tuple[int, list[int], int]:
    """The page `number`'s run ids and how many runs match; past the last page, the last page's. Newest first
    on the run's own columns: the page from the index run_newest and the count from run_project_archived_id
    (the window below read and sorted every matching row: ~190 ms against under 15 at 100,000 runs); else
    one query, `COUNT(*) OVER ()` beside each id (a count apart ran the filters' joins a second time)."""
    joined = [alias for alias in ordered.query.alias_map if ordered.query.alias_refcount[alias]]  # trimmed ones: 0
    if newest and len(joined) == 1:  # `newest`: ordered by ORDER_NEWEST, said by the caller, not found by identity
        ids = list(ordered.values_list("pk", flat=True)[(number - 1) * PAGE_SIZE:number * PAGE_SIZE])
        if ids:
            return number, ids, ordered.count()
    else:
        counted = ordered.annotate(matched=Window(Count("pk"))).values_list("pk", "matched")
        rows = list(counted[(number - 1) * PAGE_SIZE:number * PAGE_SIZE])
        if rows:
            return number, [pk for pk, _ in rows], rows[0][1]
    total = ordered.count()  # an empty page: none matches, or a page past the last was asked for
    last = max(1, math.ceil(total / PAGE_SIZE))
    if number <= last:  # none matches (page 1), or the runs went while it asked
        return number, [], total
    return _page_ids(ordered, last, newest=newest)


def run_table(*, filters: RunFilters, visible: list[int] | None = None) -> tuple[Page, int]:
    """One page of runs and how many runs match in all, of the projects `visible` (None: every project;
    runs.projects.access.visible_project_ids).

    Two steps: the page's ids, from a query with only what the filters and the sort need, then
    those 50 rows with every column. Computing status and best loss for 10,000 runs to show 50 took
    longer than everything else on the page."""
    runs = PipelineRun.objects.all() if visible is None else PipelineRun.objects.filter(project_id__in=visible)
    if filters.archived != "with":
        runs = runs.filter(archived=filters.archived == "only")
    if filters.status or filters.sort in ("status", "duration", "best_val_loss"):
        runs = with_columns(runs)
    if filters.q:
        runs = searched(runs, filters.q)
    if filters.status:
        runs = runs.filter(status=filters.status)
    for field, value in (("target__name", filters.target), ("dataset__name", filters.dataset),
                         ("owner__username", filters.owner)):
        if value:
            runs = runs.filter(**{field: value})
    if filters.tag:
        runs = runs.filter(pk__in=tagged_run_ids(name=filters.tag))
    if filters.project:  # a subquery, not a join: the page and its count then read the run's own indexes
        runs = runs.filter(project_id__in=Project.objects.filter(name=filters.project).values("pk"))
    if filters.sweep is not None:
        runs = runs.filter(sweep_entry__sweep_id=filters.sweep)
    for name, value in filters.settings:
        runs = runs.filter(setting_match(name, value))
    if filters.sort == "tau" or filters.tau_min is not None or filters.tau_max is not None:
        # The best checkpoint's, else the evaluate stage's (PipelineRun.shown_tau), as the run's row keeps it
        # (runs.pipeline.status.list_tau): joining both rows of every run the other filters kept cost half the page.
        runs = runs.annotate(tau=F("list_tau"))
    if filters.tau_min is not None:
        runs = runs.filter(tau__gte=filters.tau_min)
    if filters.tau_max is not None:
        runs = runs.filter(tau__lte=filters.tau_max)
    column = F(SORTS[filters.sort])
    order = column.desc(nulls_last=True) if filters.descending else column.asc(nulls_last=True)
    newest = filters.sort == "created" and filters.descending
    if newest:  # the index's order (created_at is never null)
        order = ORDER_NEWEST
    ordered = runs.order_by(order, "-id")
    number, ids, total = _page_ids(ordered, filters.page, newest=newest)
    paginator = Paginator(ordered, PAGE_SIZE)
    paginator.count = total  # known: Page and the template read it, and must not ask again
    page = Page(ids, number, paginator)
    rows = {run.pk: run for run in _shown_columns(run_rows()).filter(pk__in=ids).prefetch_related("tags")}
    for run in rows.values():
        run.status = run_status(run)
        run.status_reason = run_status_reason(run, run.status)
    page.object_list = [rows[pk] for pk in ids if pk in rows]
    return page, paginator.count


def filter_choices() -> dict:
    """What the filter menus offer: every target, dataset, owner and tag that has a run (the projects are
    each viewer's own: runs.projects.access.visible_projects)."""

    def having_runs(model, field: str, name: str) -> list[str]:
        # Exists over the runs' foreign-key index: a handful of targets, not a scan of every run.
        used = Exists(PipelineRun.objects.filter(**{field: OuterRef("pk")}))
        return list(model.objects.filter(used).order_by(name).values_list(name, flat=True).distinct()[:MAX_CHOICES])

    return {
        "targets": having_runs(TargetModel, "target", "name"), "datasets": having_runs(Dataset, "dataset", "name"),
        "owners": having_runs(get_user_model(), "owner", "username"),
        "tags": list(PipelineRun.tags.through.objects.order_by("runtag__name").values_list("runtag__name", flat=True)
                     .distinct()[:MAX_CHOICES]),  # the tags some run carries
        "statuses": STATUSES, "settings": SETTING_FIELDS, "columns": COLUMNS,
    }


def duration_text(value: timedelta | None) -> str:
    if value is None:
        return "–"
    seconds = int(value.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
