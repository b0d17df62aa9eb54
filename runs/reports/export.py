"""A report as one HTML file that opens with no server: its text, its tables, its charts drawn as SVG
(runs.reports.svg), and every block's data (each chart's points included) as JSON in a
<script type="application/json"> element, which a browser never runs but a reader or a script can take
the numbers from. No script runs in the file and nothing in it is fetched: generations, which are read
from the server, are said to be absent."""
from __future__ import annotations

from django.contrib.staticfiles import finders
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from runs.reports.models import Report, ReportVersion
from runs.reports.rendering import report_render


def report_export_html(*, report: Report, version: ReportVersion, site: str, user) -> str:
    """`site`: the server's address ("https://eagle3.example.com/"): the file's links to runs and checkpoints
    (and the Markdown's links from the site's root) lead back to it from wherever the file is opened."""
    rendered = report_render(version.body, user=user, export=True)
    rendered.html = mark_safe(rendered.html.replace('href="/', f'href="{escape(site.rstrip("/"))}/'))
    return render_to_string("runs/reports/report_export.html", {
        "report": report, "version": version, "rendered": rendered, "exported_at": timezone.now(),
        "generations_css": mark_safe(_static_text("css/generations.css")),
        "data": {"report": report.pk, "version": version.number, "title": version.title, "blocks": rendered.blocks}})


def _static_text(name: str) -> str:
    """One of our static files' text, to inline (the file has no static folder beside it)."""
    path = finders.find(name)
    with open(path, encoding="utf-8") as handle:
        return handle.read().replace("</", "<\\/")
