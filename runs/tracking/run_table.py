"""The runs list as a tracker shows it: searchable, filterable, sortable, paginated, every column
computed in the list's own query (status, duration, best validation loss, tau), never per row."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.paginator import Page, Paginator
from django.db.models import (Case, CharField, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet, Subquery,
                              Value, When)
from django.db.models.functions import Coalesce, Now

from runs.models import Checkpoint, Dataset, PipelineRun, RunTag, StageStatus, TargetModel
from runs.pipeline.stages import STAGES
from runs.pipeline.selectors import (RUN_HELD, RUN_STATUS_OTHERWISE, RUN_STATUS_RULES, RUN_STATUSES, run_rows,
                                     run_status, run_status_reason)
from workers.contract.errors import InputError

PAGE_SIZE = 50
MAX_CHOICES = 500  # entries of a filter menu; the search box finds the rest
MAX_QUERY_CHARS = 200
SORTS = {
    "created": "created_at", "name": "name", "status": "status", "duration": "duration",
    "best_val_loss": "best_val_loss", "tau": "tau", "owner": "owner__username",
    "epochs": "training_run__epochs",
}
STATUSES = RUN_STATUSES  # the stages' words and "held" (a sweep's run not yet handed to the queues)
COLUMNS = (("name", "Run"), ("status", "Status"), ("duration", "Duration"), ("epochs", "Epochs"),
           ("best_val_loss", "Best val loss"), ("tau", "τ"), ("owner", "Owner"), ("created", "Created"))


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
    sort: str = "created"
    descending: bool = True
    page: int = 1

    @classmethod
    def from_query(cls, params) -> "RunFilters":
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
        return cls(q=text("q"), status=status, target=text("target"), dataset=text("dataset"), owner=text("owner"),
                   tag=text("tag"), sort=sort.lstrip("-"), descending=descending, page=int(page))

    def sort_link(self, column: str) -> str:
        """The `sort` value a column header links to: the same column flips the order."""
        if column == self.sort:
            return column if self.descending else f"-{column}"
        return f"-{column}" if column in ("created", "best_val_loss", "tau", "duration") else column


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


def _tagged(**tag_filter):
    """Ids of runs carrying a matching tag, as a subquery: joining the tags would repeat runs."""
    return RunTag.runs.through.objects.filter(**{f"runtag__{k}": v for k, v in tag_filter.items()}).values(
        "pipelinerun_id")


def run_table(*, filters: RunFilters) -> tuple[Page, int]:
    """One page of runs and how many runs match in all.

    Two steps: the page's ids, from a query with only what the filters and the sort need, then
    those 50 rows with every column. Computing status and best loss for 10,000 runs to show 50 took
    longer than everything else on the page."""
    runs = PipelineRun.objects.all()
    if filters.status or filters.sort in ("status", "duration", "best_val_loss"):
        runs = with_columns(runs)
    if filters.q:
        match = (Q(name__icontains=filters.q) | Q(target__name__icontains=filters.q)
                 | Q(dataset__name__icontains=filters.q) | Q(owner__username__icontains=filters.q)
                 | Q(pk__in=_tagged(name__iexact=filters.q)))
        if filters.q.isdigit() and len(filters.q) < 18:
            match |= Q(pk=int(filters.q))
        runs = runs.filter(match)
    if filters.status:
        runs = runs.filter(status=filters.status)
    for field, value in (("target__name", filters.target), ("dataset__name", filters.dataset),
                         ("owner__username", filters.owner)):
        if value:
            runs = runs.filter(**{field: value})
    if filters.tag:
        runs = runs.filter(pk__in=_tagged(name=filters.tag))
    if filters.sort == "tau":  # the best checkpoint's, else the evaluate stage's (PipelineRun.shown_tau)
        runs = runs.annotate(tau=Coalesce("training_run__best_tau", "evaluation__tau"))
    column = F(SORTS[filters.sort])
    order = column.desc(nulls_last=True) if filters.descending else column.asc(nulls_last=True)
    paginator = Paginator(runs.order_by(order, "-id").values_list("pk", flat=True), PAGE_SIZE)
    page = paginator.page(min(filters.page, max(1, paginator.num_pages)))
    ids = list(page.object_list)
    rows = {run.pk: run for run in _shown_columns(run_rows()).filter(pk__in=ids).prefetch_related("tags")}
    for run in rows.values():
        run.status = run_status(run)
        run.status_reason = run_status_reason(run, run.status)
    page.object_list = [rows[pk] for pk in ids if pk in rows]
    return page, paginator.count


def filter_choices() -> dict:
    """What the filter menus offer: every target, dataset, owner and tag that has a run."""

    def having_runs(model, field: str, name: str) -> list[str]:
        # Exists over the runs' foreign-key index: a handful of targets, not a scan of every run.
        used = Exists(PipelineRun.objects.filter(**{field: OuterRef("pk")}))
        return list(model.objects.filter(used).order_by(name).values_list(name, flat=True).distinct()[:MAX_CHOICES])

    return {
        "targets": having_runs(TargetModel, "target", "name"), "datasets": having_runs(Dataset, "dataset", "name"),
        "owners": having_runs(get_user_model(), "owner", "username"),
        "tags": list(RunTag.objects.filter(runs__isnull=False).distinct().values_list("name", flat=True)[:MAX_CHOICES]),
        "statuses": STATUSES,
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
