"""The runs list's forms: save the view on screen, delete a saved view, act on the ticked runs (tag,
archive, bring back). Thin: parse, call a service, go back to the list; refused input answers the list
page with 400 and the field named."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from runs.projects import bulk
from runs.saved_views import page, selectors, services
from runs.tracking.runs_list import run_filters
from workers.contract.errors import InputError

MAX_QUERY_CHARS = 4000


def _list_query(request: HttpRequest) -> QueryDict:
    """The list's query the form was sent from (its hidden `query`), to save or to go back to."""
    return QueryDict(request.POST.get("query", "")[:MAX_QUERY_CHARS])


def _refused(request: HttpRequest, exc: InputError, query: QueryDict) -> HttpResponse:
    field = getattr(exc, "field", None) or "__all__"
    messages.error(request, str(exc))
    try:
        run_filters.RunFilters.from_query(query)
    except run_filters.RunTableError:  # the refused query itself: the list is shown unfiltered under the message
        query = QueryDict()
    return page.run_list_response(request, params=query, status=400, form_errors={field: str(exc)})


def _back(query: QueryDict, **extra) -> HttpResponse:
    query = query.copy()
    for key, value in extra.items():
        query[key] = value
    return redirect(reverse("runs:run_list") + (f"?{query.urlencode()}" if query else ""))


@require_POST
def saved_view_save(request: HttpRequest) -> HttpResponse:
    query = _list_query(request)
    try:
        view = services.saved_view_save(user=request.user, name=request.POST.get("name", ""), params=query,
                                        project_name=request.POST.get("project", ""),
                                        shared=request.POST.get("shared") == "on")
    except InputError as exc:
        return _refused(request, exc, query)
    messages.success(request, f"Saved the view {view.name!r}" + (f", shared with {view.project}." if view.shared else "."))
    return redirect(reverse("runs:run_list") + f"?view={view.pk}")


@require_POST
def saved_view_delete(request: HttpRequest, pk: int) -> HttpResponse:
    view = selectors.saved_view_get(user=request.user, pk=pk)
    try:
        services.saved_view_delete(user=request.user, view=view)
    except InputError as exc:
        return _refused(request, exc, QueryDict())
    messages.info(request, f"Deleted the view {view.name!r}.")
    return redirect("runs:run_list")


@require_POST
def runs_bulk(request: HttpRequest) -> HttpResponse:
    """The ticked runs: `action` tag (with `tags`), archive or unarchive."""
    query = _list_query(request)
    action = request.POST.get("action", "")
    try:
        ids = bulk.bulk_ids(request.POST.getlist("ids"))
        if action == "tag":
            names = bulk.runs_tag_add(user=request.user, run_ids=ids, text=request.POST.get("tags", ""))
            messages.success(request, f"Tagged {len(ids)} run(s) {', '.join(names)}.")
        elif action in ("archive", "unarchive"):
            count = bulk.runs_archive(user=request.user, run_ids=ids, archived=action == "archive")
            messages.success(request, f"{'Archived' if action == 'archive' else 'Brought back'} {count} run(s).")
        else:
            raise bulk.BulkError(f"action must be tag, archive or unarchive, got {action[:20]!r}", field="action")
    except InputError as exc:
        return _refused(request, exc, query)
    return _back(query)
