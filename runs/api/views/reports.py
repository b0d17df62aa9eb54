"""/api/v1/reports/: the reports (a page at a time), writing one, and one report with its Markdown, its
rendered HTML and its blocks (`?version=N` for an older version). Thin: a serializer, a service or a
selector, answer."""
from __future__ import annotations

from django.urls import reverse
from rest_framework import serializers
from rest_framework.response import Response

from runs.api.base import ApiInputError, ApiView, created, paginate
from runs.reports import selectors, services
from runs.reports.models import MAX_BODY_CHARS, MAX_TITLE_CHARS
from runs.reports.rendering import report_render

PAGE_SIZE = 50


class ReportSerializer(serializers.Serializer):
    title = serializers.CharField(max_length=MAX_TITLE_CHARS, help_text="shown in the list and as the page's heading")
    body = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, max_length=MAX_BODY_CHARS,
                                 help_text="Markdown; a line {{chart run=1,2 metric=loss}}, {{table runs=1,2 "
                                           "columns=tau,best_epoch}} or {{generations checkpoint=3}} embeds a block")


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def report_row(report, request) -> dict:
    return {"id": report.pk, "title": report.title, "author": report.author.get_username(),
            "versions": report.version_count, "created_at": _iso(report.created_at),
            "updated_at": _iso(report.updated_at),
            "url": request.build_absolute_uri(reverse("api:report_detail", args=[report.pk])),
            "page_url": request.build_absolute_uri(report.get_absolute_url())}


class ReportList(ApiView):
    request_serializers = {"POST": ReportSerializer}
    query_params = {"GET": [("page", "integer", f"from 1; {PAGE_SIZE} reports a page")]}
    responses = {"GET": {"200": "{count, page, pages, page_size, next, previous, results: [reports]}"},
                 "POST": {"201": "the report, as GET /api/v1/reports/<id>/ answers it (version 1)"}}

    def get(self, request):
        """Every report, the most recently saved first (every signed-in user reads every report)."""
        unknown = sorted(set(request.query_params) - {"page"})
        if unknown:
            raise ApiInputError(f"unknown parameter {unknown[0][:40]!r} (known: page)", field=unknown[0][:40])
        return Response(paginate(request, selectors.report_list(), page_size=PAGE_SIZE,
                                 shape=lambda report: report_row(report, request)))

    def post(self, request):
        """Write a report: its version 1, by the token's (or session's) user."""
        body = self.body()
        report = services.report_create(user=request.user, title=body["title"], body=body.get("body", ""))
        return created(report_answer(report, request, number=None))


def report_answer(report, request, *, number: int | None) -> dict:
    version = selectors.report_version(report=report, number=number)
    rendered = report_render(version.body, user=request.user)
    return {**report_row(report, request), "version": version.number, "version_title": version.title,
            "saved_by": version.saved_by.get_username(), "saved_at": _iso(version.created_at),
            "body": version.body, "html": str(rendered.html), "blocks": rendered.blocks, "errors": rendered.errors,
            "can_edit": selectors.may_edit(user=request.user, report=report)}


class ReportDetail(ApiView):
    query_params = {"GET": [("version", "integer", "a version number; omitted: the newest")]}
    responses = {"GET": {"200": "{id, title, author, versions, version, body (Markdown), html (sanitised), blocks, "
                                "errors (the blocks that could not be shown, each saying why)}"}}

    def get(self, request, pk: int):
        """One report: its newest version (or `?version=N`), rendered as its page shows it."""
        unknown = sorted(set(request.query_params) - {"version"})
        if unknown:
            raise ApiInputError(f"unknown parameter {unknown[0][:40]!r} (known: version)", field=unknown[0][:40])
        text = request.query_params.get("version", "")
        if text and not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise ApiInputError(f"version must be a version number, got {text[:20]!r}", field="version")
        report = selectors.report_get(pk=pk)
        return Response(report_answer(report, request, number=int(text) if text else None))
