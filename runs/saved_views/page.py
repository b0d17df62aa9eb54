"""The runs list page: its table (shared by every viewer of the same projects and the same query, cached
until a run, review or tag changes), the viewer's saved views, and the forms to save a view and to act on
the ticked runs. runs.web.views.run_list and the forms' views (runs.saved_views.views) answer with it."""
from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from runs.review import reviews
from runs.saved_views import selectors as view_selectors
from runs.saved_views import table_rows, viewer_reads
from runs.saved_views.table_rows import esc
from runs.tracking import comparison
from runs.tracking.runs_list import run_filters, run_table
from runs import live

# The runs list's table says "3 minutes ago" and how long running runs have run (the page counts those
# on by itself): rendered again at least this often even when no run changed.
RUN_TABLE_SECONDS = 30


def _run_table_html(*, filters: run_filters.RunFilters, params: QueryDict, visible: list[int] | None) -> str:
    page, total = run_table.run_table(filters=filters, visible=visible)
    runs = list(page.object_list)
    states = reviews.review_states(kind="run", ids=[run.pk for run in runs]) if "review" in filters.columns else {}
    query = params.copy()
    query.pop("page", None)
    columns = []
    for key, label in run_filters.COLUMNS:
        if key not in filters.columns:
            continue
        by_column = query.copy()
        by_column["sort"] = filters.sort_link(key)
        state = ("desc" if filters.descending else "asc") if key == filters.sort else ""
        columns.append({"key": key, "label": label, "href": by_column.urlencode() if key in run_filters.SORTS else "",
                        "state": state})
    # No request: nothing of the viewer's may enter what every viewer of these projects is shown.
    return render_to_string("runs/tracking/_run_table.html", {
        "rows": runs, "body": table_rows.rows_html(runs, states, columns=filters.columns,
                                                   launch_url=reverse("runs:run_launch")),
        "page": page, "total": total, "filters": filters, "query": query.urlencode(), "columns": columns,
        "compare_max": comparison.MAX_COMPARED})


def _options(values, selected: str) -> SafeString:
    """A filter menu's options, the one equal to `selected` selected, each value its own text (the template's loop
    over up to MAX_CHOICES values per menu took a third of the page's rendering)."""
    return mark_safe("".join(f"<option selected>{esc(value)}</option>" if value == selected else  # noqa: S308
                             f"<option>{esc(value)}</option>" for value in values))


def _view_asked(request: HttpRequest, views: list) -> object:
    """The saved view `?view=<id>` among those the user finds (`views`), or None; Http404 for any other."""
    raw = request.GET.get("view", "")
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise Http404(f"no saved view {raw[:20]!r}")
    view = next((v for v in views if v.pk == int(raw)), None)
    if view is None:  # in the words of view_selectors.saved_view_get: a view of others reads as a missing one
        raise Http404(f"no saved view {int(raw)}")
    return view


def run_list_response(request: HttpRequest, *, params: QueryDict | None = None, view=None, status: int = 200,
                      form_errors: dict | None = None) -> HttpResponse:
    # The viewer's projects, their saved views (the views menu's, which the view asked for is one of), the
    # frame's counts (the bell's unread alerts) and the list's version: one statement.
    reads = viewer_reads.viewer_reads(request.user)
    visible, views = reads.visible, reads.views
    if params is None:
        view = _view_asked(request, views)
        params = request.GET if view is None else view_selectors.view_query(view, request.GET)
    try:
        filters = run_filters.RunFilters.from_query(params)
    except run_filters.RunTableError as exc:
        messages.error(request, str(exc))
        return redirect("runs:run_list")
    # What every viewer of the same projects sees alike, cached until a run, review or tag changes.
    version = reads.version
    table = live.cached(("run_table", version, visible, sorted(params.lists())), lambda: (
        _run_table_html(filters=filters, params=params, visible=visible), RUN_TABLE_SECONDS))
    choices = live.cached(("run_choices", version), lambda: (run_table.filter_choices(), live.SETTLED_SECONDS))
    query = params.copy()
    query.pop("page", None)
    menus = {name: _options(values, selected) for name, values, selected in (
        ("status", choices["statuses"], filters.status), ("project", reads.project_names, filters.project),
        ("target", choices["targets"], filters.target), ("dataset", choices["datasets"], filters.dataset),
        ("owner", choices["owners"], filters.owner), ("tag", choices["tags"], filters.tag))}
    return render(request, "runs/tracking/run_list.html", {
        "table": mark_safe(table), "filters": filters, "choices": choices, "menus": menus,  # noqa: S308 - escaped
        "projects": reads.project_names, "views": views, "view": view,
        "query": query.urlencode(), "settings_text": run_filters.settings_text(filters.settings),
        "form_errors": form_errors or {}, **reads.counts}, status=status)
