"""The reports pages: the list, a report (its newest version or any other), its versions, writing one
(textarea with a preview) and its export as one HTML file. Thin: a form, a service or a selector, render.
Every page needs a sign-in (the site's LoginRequiredMiddleware); editing is the author's and staff's."""
from __future__ import annotations

from django import forms
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from runs.reports import export, selectors, services
from runs.reports.models import MAX_BODY_CHARS, MAX_TITLE_CHARS
from runs.reports.rendering import report_render


class ReportForm(forms.Form):
    title = forms.CharField(max_length=MAX_TITLE_CHARS)
    body = forms.CharField(required=False, max_length=MAX_BODY_CHARS, strip=False,
                           widget=forms.Textarea(attrs={"rows": 24, "cols": 100, "spellcheck": "true"}))


def report_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.report_list(), 50).get_page(request.GET.get("page"))
    return render(request, "runs/reports/report_list.html", {"page": page, "reports": page.object_list})


def _shown(request: HttpRequest, pk: int, number: int | None) -> HttpResponse:
    report = selectors.report_get(pk=pk)
    version = selectors.report_version(report=report, number=number)
    rendered = report_render(version.body, user=request.user)
    return render(request, "runs/reports/report_detail.html", {
        "report": report, "version": version, "rendered": rendered, "is_newest": version.number == report.version_count,
        "can_edit": selectors.may_edit(user=request.user, report=report),
        "share_url": request.build_absolute_uri(report.get_absolute_url())})


def report_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _shown(request, pk, None)


def report_version(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    return _shown(request, pk, number)


def report_versions(request: HttpRequest, pk: int) -> HttpResponse:
    report = selectors.report_get(pk=pk)
    return render(request, "runs/reports/report_versions.html", {"report": report,
                                                         "versions": selectors.report_versions(report=report)})


def _edit_page(request, *, report, form: ReportForm, preview=None, status: int = 200) -> HttpResponse:
    return render(request, "runs/reports/report_edit.html", {"report": report, "form": form, "preview": preview},
                  status=status)


def _write(request: HttpRequest, report) -> HttpResponse:
    """POST of the edit form: "preview" renders the body below the form and stores nothing; else a save."""
    form = ReportForm(request.POST)
    if not form.is_valid():
        return _edit_page(request, report=report, form=form, status=400)
    title, body = form.cleaned_data["title"], form.cleaned_data["body"]
    if "preview" in request.POST:
        return _edit_page(request, report=report, form=form, preview=report_render(body, user=request.user))
    try:
        if report is None:
            report = services.report_create(user=request.user, title=title, body=body)
        else:
            services.report_save(report=report, user=request.user, title=title, body=body)
    except services.ReportError as exc:
        form.add_error(exc.field, str(exc))
        return _edit_page(request, report=report, form=form, status=400)
    return redirect(report)


def report_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _write(request, None)
    return _edit_page(request, report=None, form=ReportForm())


def report_edit(request: HttpRequest, pk: int) -> HttpResponse:
    report = selectors.report_get(pk=pk)
    if not selectors.may_edit(user=request.user, report=report):
        raise PermissionDenied(f"{request.user.get_username()} may not edit report {report.pk}: only its author "
                               f"({report.author.get_username()}) and staff may")
    if request.method == "POST":
        return _write(request, report)
    version = selectors.report_version(report=report)
    return _edit_page(request, report=report, form=ReportForm(initial={"title": version.title, "body": version.body}))


def report_export(request: HttpRequest, pk: int) -> HttpResponse:
    """The report (`?version=N`, else its newest) as one HTML file that opens with no server."""
    report = selectors.report_get(pk=pk)
    text = request.GET.get("version", "")
    if text and not (text.isascii() and text.isdigit() and len(text) <= 18):
        return HttpResponse(f"version must be a version number, got {text[:20]!r}", status=400,
                            content_type="text/plain; charset=utf-8")
    version = selectors.report_version(report=report, number=int(text) if text else None)
    response = HttpResponse(export.report_export_html(report=report, version=version,
                                                      site=request.build_absolute_uri("/"), user=request.user),
                            content_type="text/html; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="report-{report.pk}-v{version.number}.html"'
    return response
