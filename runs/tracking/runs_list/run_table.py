"""The runs list as a tracker shows it: searchable, filterable, sortable, paginated, every column
computed in the list's own query (status, duration, best validation loss, tau), never per row. The query's
parameters are read and checked in runs.tracking.runs_list.run_filters, its search in runs.tracking.runs_list.run_search."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import functools
import math
import threading

from django.contrib.auth import get_user_model
from django.core.exceptions import EmptyResultSet
from django.core.paginator import Page, Paginator
from django.db import connection
from django.urls import reverse
from django.db.models import (Case, CharField, Count, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet,
                              Subquery, Value, When, Window)
from django.db.models.functions import Coalesce, Now

from eagle3web.db import CompiledQuery, compile_query, compile_statement, prepared_cursor, stand_in
from runs.checkpoints.models import Checkpoint
from runs.data.models import Dataset, TargetModel
from runs.pipeline.models import PipelineRun, shown_tau_of
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.projects.models import Project
from runs.pipeline.lifecycle.stages import STAGES
from runs.tracking.runs_list.run_search import searched, setting_match, tagged_run_ids
from runs.pipeline.status.run_status import (RUN_HELD, RUN_STATUS_OTHERWISE, RUN_STATUS_RULES, status_of,
                                             status_reason_of)
from runs.tracking.runs_list.run_filters import COLUMNS, SETTING_FIELDS, SORTS, STATUSES, RunFilters

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


@dataclass(frozen=True)
class PageStatements:
    """How a filter set's pages are read: its matching runs' ids in order (each beside the count of all when
    `counted`), unsliced, and how many match, on its own; None for filters that match nothing whatever the runs
    (no project visible)."""
    ids: tuple[str, tuple] | None
    counted: bool
    count: tuple[str, tuple] | None
    prepared: bool = True  # kept and run again (not a search's, whose text names what its words matched)

    @classmethod
    def of(cls, ordered: QuerySet[PipelineRun], *, counted: bool) -> "PageStatements":
        rows = ordered.annotate(matched=Window(Count("pk"))).values_list("pk", "matched") if counted else \
            ordered.values_list("pk")
        try:
            sql, params = ordered.order_by().values("pk").query.sql_with_params()
            return cls(ids=rows.query.sql_with_params(), counted=counted,
                       count=(f"SELECT COUNT(*) FROM ({sql}) AS matched", params))
        except EmptyResultSet:  # as Django reads such a queryset: no statement, no rows
            return cls(ids=None, counted=counted, count=None)


def _page_statements_of(ordered: QuerySet[PipelineRun], *, newest: bool) -> PageStatements:
    """Newest first on the run's own columns: the page from the index run_newest and the count from
    run_project_archived_id (the window read and sorted every matching row: ~190 ms against under 15 at 100,000
    runs); else one query, `COUNT(*) OVER ()` beside each id (a count apart ran the filters' joins a second time)."""
    query = ordered.query
    joins = [alias for alias in query.alias_map if alias != query.base_table and query.alias_refcount[alias]]
    # `newest`: ordered by ORDER_NEWEST, said by the caller, not found by identity. Trimmed joins count 0.
    return PageStatements.of(ordered, counted=not newest or bool(joins))


# A filter set's PageStatements, compiled once a process for each of the last ones asked (a saved view, the list,
# a sort): building and compiling the filters' queryset took longer than PostgreSQL took to answer (issue 40).
# Bounded, and only what the filters alone decide: a search reads its matching targets, owners and tags first.
PAGE_STATEMENTS_KEPT = 128
_page_statements: OrderedDict[str, PageStatements] = OrderedDict()
_page_statements_lock = threading.Lock()


def _statements(filters: RunFilters, visible: list[int] | None) -> PageStatements:
    def build() -> PageStatements:
        ordered, newest = _ordered(filters, visible)
        return _page_statements_of(ordered, newest=newest)

    if filters.q:
        return replace(build(), prepared=False)
    key = repr((replace(filters, page=1, columns=()), visible))
    with _page_statements_lock:
        found = _page_statements.get(key)
        if found is not None:
            _page_statements.move_to_end(key)
            return found
    made = build()
    with _page_statements_lock:
        _page_statements[key] = made
        while len(_page_statements) > PAGE_STATEMENTS_KEPT:
            _page_statements.popitem(last=False)
    return made


def _page_ids(statements: PageStatements, number: int) -> tuple[int, list[int], int]:
    """The page `number`'s run ids and how many runs match; past the last page, the last page's."""
    if statements.ids is None:
        return 1, [], 0
    sql, params = statements.ids
    # Planned once a connection (PostgreSQL keeps a generic plan of each); a search's are run once.
    with prepared_cursor(connection) if statements.prepared else connection.cursor() as cursor:
        cursor.execute(f"{sql} LIMIT %s OFFSET %s", (*params, PAGE_SIZE, (number - 1) * PAGE_SIZE))
        rows = cursor.fetchall()
        if rows and statements.counted:
            return number, [row[0] for row in rows], rows[0][1]
        cursor.execute(*statements.count)
        total = cursor.fetchone()[0]
    if rows:
        return number, [row[0] for row in rows], total
    # An empty page: none matches, or a page past the last was asked for.
    last = max(1, math.ceil(total / PAGE_SIZE))
    if number <= last:  # none matches (page 1), or the runs went while it asked
        return number, [], total
    return _page_ids(statements, last)


def _ordered(filters: RunFilters, visible: list[int] | None) -> tuple[QuerySet[PipelineRun], bool]:
    """The runs `filters` pick of the projects `visible`, in the order they ask, and whether that is newest first."""
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
    return runs.order_by(order, "-id"), newest


def run_table(*, filters: RunFilters, visible: list[int] | None = None) -> tuple[Page, int]:
    """One page of runs (ListedRun) and how many runs match in all, of the projects `visible` (None: every project;
    runs.projects.access.visible_project_ids).

    Two steps: the page's ids, from a query with only what the filters and the sort need, then
    those 50 rows with every column, as values. Computing status and best loss for 10,000 runs to show 50 took
    longer than everything else on the page."""
    number, ids, total = _page_ids(_statements(filters, visible), filters.page)
    paginator = Paginator((), PAGE_SIZE)
    paginator.count = total  # known: Page and the template read it, and must not ask again
    page = Page(ids, number, paginator)
    rows = listed_runs(ids)
    page.object_list = [rows[pk] for pk in ids if pk in rows]
    return page, paginator.count


# The page's rows: what the page and the API show of each run of a page, read as plain values in one
# query that joins its stages and, on PostgreSQL, carries their tags (_rows). Model instances with a prefetch
# per stage took six queries and about 14 ms of Python for a page of 50 (issue 40); these rows take one query.
# The run's status and τ come from the same rules as a run read whole (runs.pipeline.selectors.status_of,
# runs.pipeline.models.shown_tau_of).
@dataclass
class ListedRun:
    pk: int
    name: str
    external: bool
    archived: bool
    created_at: datetime
    owner_name: str
    target_name: str | None
    dataset_name: str | None
    project_name: str
    stage_statuses: dict[str, str]  # by the stage's related name (STAGES), the five or the training alone
    prepare_started_at: datetime | None
    train_started_at: datetime | None
    layer_ids: list[int]
    epochs: int | None
    best_epoch: int | None
    shown_tau: float | None
    duration: timedelta | None
    best_val_loss: float | None
    status: str
    status_reason: str
    tags: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:run_detail", args=[self.pk])


_STAGE_STATUS = [f"{stage.related_name}__status" for stage in STAGES]
_TRAINING = next(stage.related_name for stage in STAGES if stage.name == "train")


def _named(model, field: str, outer: str) -> Subquery:
    return Subquery(model.objects.filter(pk=OuterRef(outer)).values(field)[:1])


@functools.cache
def _rows() -> QuerySet[PipelineRun]:
    """Every run with the rows' columns, as values: built once a process (its expressions took longer to build
    than the query to run, issue 40), a page's filtered from it. The owner's, target's, dataset's and
    project's names and the holding sweep are subqueries, not joins: PostgreSQL spent 2.5 ms of the query's
    4 planning twelve joined tables, and plans each subquery on its own in a few microseconds. On PostgreSQL
    the run's tags come in the same query, an ARRAY of their names; on SQLite (the demo) in one of their own."""
    user = get_user_model()
    rows = _shown_columns(PipelineRun.objects.order_by()).annotate(
        owner_name=_named(user, user.USERNAME_FIELD, "owner_id"), target_name=_named(TargetModel, "name", "target_id"),
        dataset_name=_named(Dataset, "name", "dataset_id"), project_name=_named(Project, "name", "project_id"),
        # The sweep that has not handed the run to the queues yet, as its `parallel` (run_status's RUN_HELD).
        # Through the run's side of the relation: tracking stands below sweeps.
        held_by=Subquery(PipelineRun.objects.filter(pk=OuterRef("pk"), sweep_entry__isnull=False,
                                                    sweep_entry__released_at__isnull=True)
                         .values("sweep_entry__sweep__parallel")[:1]),
    )
    columns = ["pk", "name", "external", "archived", "created_at", "owner_name", "target_name", "dataset_name",
               "project_name", "held_by", "preparation__started_at", "extract_stage__layer_ids", "training_run__epochs",
               "training_run__best_epoch", "training_run__best_tau", "training_run__started_at", "evaluation__tau",
               "duration", "best_val_loss", *_STAGE_STATUS]
    if connection.vendor == "postgresql":
        from django.contrib.postgres.expressions import ArraySubquery

        rows = rows.annotate(tag_names=ArraySubquery(_tags(pipelinerun_id=OuterRef("pk")).values("runtag__name")))
        columns.append("tag_names")
    return rows.values(*columns)


def _tags(**run_filter) -> QuerySet:
    """Tag links of the runs `run_filter` picks, each run's by its tags' names."""
    return PipelineRun.tags.through.objects.filter(**run_filter).order_by("runtag__name")


@functools.lru_cache(maxsize=PAGE_SIZE)
def _rows_of(count: int) -> CompiledQuery:
    """_rows() of `count` runs (run0, run1, ...), compiled once a process for each count up to a page's: compiling
    the rows' expressions took longer than PostgreSQL took to answer (issue 40)."""
    ids = [stand_in(i) for i in range(count)]
    return compile_query(_rows().filter(pk__in=ids), **{f"run{i}": pk for i, pk in enumerate(ids)})


def listed_runs(ids: list[int]) -> dict[int, ListedRun]:
    """The runs `ids` (at most a page's, each once) by id."""
    if not ids:
        return {}
    # The page orders them by its ids.
    rows = _rows_of(len(ids)).fetch_values(**{f"run{i}": pk for i, pk in enumerate(ids)})
    if rows and "tag_names" in rows[0]:
        tags = {row["pk"]: row["tag_names"] for row in rows}
    else:
        tags = {pk: [] for pk in ids}
        for run_id, name in _tags(pipelinerun_id__in=ids).values_list("pipelinerun_id", "runtag__name"):
            tags[run_id].append(name)
    out = {}
    for row in rows:
        external = row["external"]
        statuses = ({_TRAINING: row[f"{_TRAINING}__status"]} if external else
                    {stage.related_name: row[f"{stage.related_name}__status"] for stage in STAGES})
        held_by = row["held_by"]
        status = status_of(list(statuses.values()), external=external, held=lambda: held_by is not None)
        out[row["pk"]] = ListedRun(
            pk=row["pk"], name=row["name"], external=external, archived=row["archived"], created_at=row["created_at"],
            owner_name=row["owner_name"], target_name=row["target_name"],
            dataset_name=row["dataset_name"], project_name=row["project_name"], stage_statuses=statuses,
            prepare_started_at=row["preparation__started_at"], train_started_at=row["training_run__started_at"],
            layer_ids=row["extract_stage__layer_ids"] or [], epochs=row["training_run__epochs"],
            best_epoch=row["training_run__best_epoch"],
            shown_tau=shown_tau_of(external=external, best_tau=row["training_run__best_tau"],
                                   evaluated_tau=row["evaluation__tau"], evaluation_status=row["evaluation__status"]),
            duration=row["duration"], best_val_loss=row["best_val_loss"], status=status,
            status_reason=status_reason_of(status, sweep_parallel=held_by), tags=tags[row["pk"]])
    return out


def _menus() -> dict[str, QuerySet]:
    """The filter menus' values: every target, dataset, owner and tag that has a run."""

    def having_runs(model, field: str, name: str) -> QuerySet:
        # Exists over the runs' foreign-key index: a handful of targets, not a scan of every run.
        used = Exists(PipelineRun.objects.filter(**{field: OuterRef("pk")}))
        return model.objects.filter(used).order_by(name).values_list(name, flat=True).distinct()[:MAX_CHOICES]

    return {"targets": having_runs(TargetModel, "target", "name"), "datasets": having_runs(Dataset, "dataset", "name"),
            "owners": having_runs(get_user_model(), "owner", "username"),
            "tags": PipelineRun.tags.through.objects.order_by("runtag__name").values_list("runtag__name", flat=True)
            .distinct()[:MAX_CHOICES]}  # the tags some run carries


@functools.cache
def _menus_statement() -> tuple[tuple[str, ...], CompiledQuery]:
    """_menus() as one PostgreSQL statement, each menu an ARRAY of its own; the same for every request, so compiled
    once a process and prepared (four round trips and their compiling were a fifth of a list page built afresh, and
    PostgreSQL planned the one statement in 2 to 3 ms against 1 to run it, issue 40)."""
    menus, parts, params = _menus(), [], []
    for query in menus.values():
        sql, found = query.query.sql_with_params()
        parts.append(f"ARRAY({sql})")
        params.extend(found)
    return tuple(menus), compile_statement("SELECT " + ", ".join(parts), tuple(params), database="default")


def filter_choices() -> dict:
    """What the filter menus offer (_menus; the projects are each viewer's own:
    runs.projects.access.visible_projects), the statuses, settings and columns."""
    if connection.vendor == "postgresql":
        keys, statement = _menus_statement()
        found = dict(zip(keys, (list(values) for values in statement.fetch_one())))
    else:  # SQLite (the demo): a query each
        found = {key: list(query) for key, query in _menus().items()}
    return {**found, "statuses": STATUSES, "settings": SETTING_FIELDS, "columns": COLUMNS}


def duration_text(value: timedelta | None) -> str:
    if value is None:
        return "–"
    seconds = int(value.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
