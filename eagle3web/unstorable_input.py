"""The middleware that refuses a request carrying text PostgreSQL cannot store (eagle3web/storable_text.py has
the rule): 400 naming the field, in the API's JSON for the API and on templates/input_refused.html for a page."""
from __future__ import annotations

from typing import Callable, Iterator

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve
from rest_framework.views import APIView

from eagle3web.storable_text import shown, unstorable_reason

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
KIND_WORDS = {"query": "query parameter", "form": "form field", "cookie": "cookie"}


def _fields(request: HttpRequest) -> Iterator[tuple[str, str, list[str]]]:
    """(kind, name, values) for everything the request carries that a view may store or look up."""
    for name, values in request.GET.lists():
        yield "query", name, values
    if request.method == "POST" and not _is_api(request) and request.content_type in FORM_TYPES:
        # The API takes JSON only (its parser checks it; a form body is refused with 415 there).
        for name, values in request.POST.lists():
            yield "form", name, values
        for name, uploads in request.FILES.lists():
            yield "form", name, [upload.name or "" for upload in uploads]
    for name, value in request.COOKIES.items():
        yield "cookie", name, [value]


def _is_api(request: HttpRequest) -> bool:
    """Whether the request is the API's (answered in JSON): its view is one (the API's docs page at /api/v1/ is
    a page), or nothing answers it and it is under /api/."""
    try:
        view = resolve(request.path_info).func
    except Resolver404:
        return request.path.startswith("/api/")
    return isinstance(getattr(view, "cls", None), type) and issubclass(view.cls, APIView)


def _path_field(request: HttpRequest) -> str:
    """The route's name for the capture holding the bad text (`username`), else `path`."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return "path"
    return next((name for name, value in match.kwargs.items()
                 if isinstance(value, str) and unstorable_reason(value)), "path")


def unstorable_input(request: HttpRequest) -> tuple[str, str, str] | None:
    """(kind, field, message) for the first text the request carries that cannot be stored, or None."""
    reason = unstorable_reason(request.path_info)
    if reason:
        field = _path_field(request)
        return "path", field, f"{field} (in the address) {reason}"
    for kind, name, values in _fields(request):
        field = shown(name)
        reason = unstorable_reason(name)
        if reason:
            return kind, field, f"the name of the {KIND_WORDS[kind]} '{field}' {reason}"
        reason = next(filter(None, map(unstorable_reason, values)), None)
        if reason:
            return kind, field, f"{'the cookie ' if kind == 'cookie' else ''}{field} {reason}"
    return None


class UnstorableTextMiddleware:
    """Refuses a request whose path, query, form fields or cookies hold text PostgreSQL cannot store (see
    the module's docstring). Placed after the session and user are set up, both lazily, and before anything
    reads them: a refused cookie is never looked up."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        found = unstorable_input(request)
        if found is None:
            return self.get_response(request)
        kind, field, message = found
        if _is_api(request):
            response = JsonResponse({"error": message, "fields": {field: message}}, status=400)
        else:
            if kind == "cookie":
                request.user = AnonymousUser()  # the session cookie may be the bad one: the page reads no session
            response = render(request, "input_refused.html", status=400, context={
                "field": field, "message": message, "kind": kind, "back": _back(request)})
        if kind == "cookie" and not unstorable_reason(field):
            response.delete_cookie(field)  # the browser's next request goes through
        return response


def _back(request: HttpRequest) -> str:
    """The page asked for, without the query parameters that were refused (the runs list for a bad path)."""
    if unstorable_reason(request.path_info):
        return "/"
    kept = request.GET.copy()
    for name in list(kept):
        if unstorable_reason(name) or any(unstorable_reason(v) for v in kept.getlist(name)):
            del kept[name]
    return request.path + (f"?{kept.urlencode()}" if kept else "")
