"""The runs list as a tracker shows it: searchable, filterable, sortable, paginated, every column
computed in the list's own query (status, duration, best validation loss, tau), never per row."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import dataclasses
import math

from django.contrib.auth import get_user_model
from django.core.paginator import Page, Paginator
from django.db.models import (Case, CharField, Count, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet,
                              Subquery, Value, When, Window)
from django.db.models.functions import Coalesce, Now

from runs.checkpoints.models import Checkpoint
from runs.data.models import Dataset, TargetModel
from runs.pipeline.models import PipelineRun
from runs.pipeline.stage_record import StageStatus
from runs.projects.models import Project
from runs.pipeline.run_config import (FLOAT_FIELDS, INT_FIELDS, RunConfig, RunConfigError, parse_layer_ids,
                                      renamed_setting)
from runs.pipeline.stages import STAGES
from runs.tracking.run_search import searched, setting_match, tagged_run_ids
from runs.pipeline.selectors import (RUN_HELD, RUN_STATUS_OTHERWISE, RUN_STATUS_RULES, RUN_STATUSES, run_rows,
                                     run_status, run_status_reason)
from eagle3web.storable_text import shown, unstorable_reason
from workers.contract.errors import InputError

PAGE_SIZE = 50
# The default order, newest first, as the index run_newest keeps it (migration 0024).
ORDER_NEWEST = F("created_at").desc()
MAX_CHOICES = 500  # entries of a filter menu; the search box finds the rest
MAX_QUERY_CHARS = 200
SORTS = {
    "created": "created_at", "name": "name", "status": "status", "duration": "duration",
    "best_val_loss": "best_val_loss", "tau": "tau", "owner": "owner__username",
    "epochs": "training_run__epochs",
}
STATUSES = RUN_STATUSES  # the stages' words and "held" (a sweep's run not yet handed to the queues)
COLUMNS = (("name", "Run"), ("status", "Status"), ("duration", "Duration"), ("epochs", "Epochs"),
           ("best_val_loss", "Best val loss"), ("tau", "τ"), ("owner", "Owner"), ("created", "Created"),
           ("project", "Project"), ("target", "Target"), ("dataset", "Dataset"), ("layers", "Layers"),
           ("stages", "Stages"), ("tags", "Tags"), ("review", "Review"))
COLUMN_KEYS = tuple(key for key, _ in COLUMNS)
# `archived`: "" hides archived runs (the default), "with" shows them among the others, "only" alone.
ARCHIVED = ("", "with", "only")
# A filter on a setting: `setting.<RunConfig field>=<value>`, the value as the launch form takes it.
SETTING_PREFIX = "setting."
SETTING_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))
MAX_SETTING_FILTERS = 10
# Every parameter the list reads (setting.<field> besides); the API refuses others.
PARAMS = ("q", "status", "target", "dataset", "owner", "tag", "project", "sweep", "tau_min", "tau_max", "archived",
          "settings", "columns", "sort", "page")


class RunTableError(InputError):
    """A filter or sort the runs list does not know."""


@dataclass(frozen=True)
class RunFilters:
    q: str = ""
    status: str = ""
    target: str = ""
    dataset: str = ""
    owner: str = ""
    tag: str = ""
    project: str = ""
    sweep: int | None = None
    tau_min: float | None = None
    tau_max: float | None = None
    archived: str = ""
    settings: tuple = ()  # ((field, value), ...)
    columns: tuple = COLUMN_KEYS
    sort: str = "created"
    descending: bool = True
    page: int = 1

    @classmethod
    def from_query(cls, params) -> "RunFilters":
        _refuse_unstorable(params)

        def text(name: str) -> str:
            value = params.get(name, "").strip()
            if len(value) > MAX_QUERY_CHARS:
                raise RunTableError(f"{name} is {len(value)} characters long; at most {MAX_QUERY_CHARS}")
            return value

        sort = text("sort") or "-created"
        descending = sort.startswith("-")
        if sort.lstrip("-") not in SORTS:
            raise RunTableError(f"sort by {sort.lstrip('-')[:40]!r} is not offered (one of {', '.join(SORTS)})")
        status = text("status")
        if status and status not in STATUSES:
            raise RunTableError(f"status {status[:40]!r} is not a run status (one of {', '.join(STATUSES)})")
        page = text("page") or "1"
        if not (page.isascii() and page.isdigit()) or not 1 <= int(page) <= 10**6:
            raise RunTableError(f"page must be a number from 1, got {page[:20]!r}")
        archived = text("archived")
        if archived not in ARCHIVED:
            raise RunTableError(f"archived must be empty, 'with' or 'only', got {archived[:20]!r}")
        return cls(q=text("q"), status=status, target=text("target"), dataset=text("dataset"), owner=text("owner"),
                   tag=text("tag"), project=text("project"), sweep=_whole(text("sweep"), "sweep"),
                   tau_min=_number(text("tau_min"), "tau_min"), tau_max=_number(text("tau_max"), "tau_max"),
                   archived=archived, settings=_settings(params), columns=_columns(_joined(params, "columns")),
                   sort=sort.lstrip("-"), descending=descending, page=int(page))

    @property
    def narrowed(self) -> bool:
        """Whether any filter is set (the empty table then says no run matches, not that there are none)."""
        return bool(self.q or self.status or self.target or self.dataset or self.owner or self.tag or self.project
                    or self.sweep or self.tau_min is not None or self.tau_max is not None or self.archived
                    or self.settings)

    def sort_link(self, column: str) -> str:
        """The `sort` value a column header links to: the same column flips the order."""
        if column == self.sort:
            return column if self.descending else f"-{column}"
        return f"-{column}" if column in ("created", "best_val_loss", "tau", "duration") else column


def _refuse_unstorable(params) -> None:
    """Text PostgreSQL cannot store is refused, naming the parameter. A request's own query never gets here
    with any (eagle3web/storable_text.py); a query a form field carries does (a saved view's `query`)."""
    pairs = params.lists() if hasattr(params, "lists") else ((name, [value]) for name, value in params.items())
    for name, values in pairs:
        for text in (name, *values):
            reason = unstorable_reason(str(text))
            if reason:
                raise RunTableError(f"{shown(str(name))} {reason}")


def _whole(value: str, name: str) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise RunTableError(f"{name} must be an id (a whole number), got {value[:20]!r}")
    return int(value)


def _number(value: str, name: str) -> float | None:
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise RunTableError(f"{name} must be a number, got {value[:20]!r}")
    return number


def _joined(params, name: str) -> str:
    """A parameter given once ("name,tau") or as ticked boxes (columns=name&columns=tau), as one text."""
    values = params.getlist(name) if hasattr(params, "getlist") else [params.get(name, "")]
    value = ",".join(str(v) for v in values if v)
    if len(value) > MAX_QUERY_CHARS:
        raise RunTableError(f"{name} is {len(value)} characters long; at most {MAX_QUERY_CHARS}")
    return value


def _columns(value: str) -> tuple:
    if not value:
        return COLUMN_KEYS
    keys = [key.strip() for key in value.split(",") if key.strip()]
    unknown = [key for key in keys if key not in COLUMN_KEYS]
    if unknown:
        raise RunTableError(f"columns: {unknown[0][:40]!r} is not a column (one of {', '.join(COLUMN_KEYS)})")
    return tuple(key for key in COLUMN_KEYS if key in keys or key == "name")  # the run's name links to it: always


def _setting_value(name: str, text: str):
    """A setting's value as the run's config stores it."""
    try:
        if name in INT_FIELDS:
            return int(text)
        if name in FLOAT_FIELDS:
            return _number(text, SETTING_PREFIX + name)
        if name == "layer_ids":
            return parse_layer_ids(text)
    except (ValueError, RunConfigError):
        raise RunTableError(f"{SETTING_PREFIX}{name} must be a {'whole number' if name in INT_FIELDS else 'list of ids'}, "
                            f"got {text[:20]!r}") from None
    if name == "serve_check":
        if text not in ("true", "false"):
            raise RunTableError(f"{SETTING_PREFIX}{name} must be true or false, got {text[:20]!r}")
        return text == "true"
    return text


def _typed_settings(params) -> list[tuple[str, str]]:
    """(setting, value as typed): `setting.<name>=<value>` parameters, and the filter box's `settings`
    ("epochs=2; lr=3e-4", `;` between settings since layer ids hold commas)."""
    pairs = [(key[len(SETTING_PREFIX):], str(params.get(key, ""))) for key in params if key.startswith(SETTING_PREFIX)]
    typed = str(params.get("settings", "") or "")
    if len(typed) > MAX_QUERY_CHARS:
        raise RunTableError(f"settings is {len(typed)} characters long; at most {MAX_QUERY_CHARS}")
    for part in typed.split(";"):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise RunTableError(f"settings: {part.strip()[:40]!r} is not setting=value (e.g. epochs=2; lr=3e-4)")
        pairs.append((name.strip(), value))
    return pairs


def settings_text(settings: tuple) -> str:
    """The setting filters as the filter box takes them."""
    def shown(value) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return ",".join(str(i) for i in value) if isinstance(value, list) else f"{value:g}" if isinstance(
            value, float) else str(value)

    return "; ".join(f"{name}={shown(value)}" for name, value in settings)


def _settings(params) -> tuple:
    found = []
    for name, value in _typed_settings(params):
        if why := renamed_setting(name):
            raise RunTableError(f"settings: {why}")
        if name not in SETTING_FIELDS:
            raise RunTableError(f"settings: {name[:60]!r} is not a setting (one of {', '.join(SETTING_FIELDS)})")
        value = value.strip()
        if not value:
            continue
        if len(value) > MAX_QUERY_CHARS:
            raise RunTableError(f"settings: {name} is {len(value)} characters long; at most {MAX_QUERY_CHARS}")
        found.append((name, _setting_value(name, value)))
    if len(found) > MAX_SETTING_FILTERS:
        raise RunTableError(f"{len(found)} setting filters; at most {MAX_SETTING_FILTERS}")
    return tuple(sorted(found, key=lambda pair: pair[0]))


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
    """Status as selectors.run_status words it, duration, best validation loss; in SQL."""
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
        # (runs.pipeline.list_tau): joining both rows of every run the other filters kept cost half the page.
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
