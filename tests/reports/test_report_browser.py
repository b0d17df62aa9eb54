"""Reports in headless Chromium against the live server, under the Content-Security-Policy: Markdown
holding scripts, handlers and javascript: links runs none of them (no dialog, no console error) while the
chart block draws its runs' curves from the API and the table shows their values; a generations block
says "not available" when the generations API answers 404; the exported file opens from disk with the
browser offline and shows the table's values and the chart's lines."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.models import Checkpoint
from runs.reports import selectors, services
from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.reports.test_reports import HOSTILE, _run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_hostile_markdown_runs_nothing_and_the_blocks_draw(live_server, user, roots, page):
    run = _run(user, roots, name="<b>bold run</b>", lr=3e-4)
    body = HOSTILE + f"\n{{{{chart run={run.pk} metric=loss}}}}\n\n{{{{table runs={run.pk} columns=name,learning_rate}}}}\n"
    report = services.report_create(user=user, title="<svg onload=alert(7)>", body=body)
    watch = Watch(page)
    _log_in(page, live_server, user)
    response = page.goto(f"{live_server.url}/reports/{report.pk}/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator("#report-title")).to_have_text("<svg onload=alert(7)>")
    figure = page.locator("figure.report-chart")
    expect(figure).to_have_attribute("data-drawn", "1", timeout=20_000)
    legend = figure.locator(".legendtext")
    expect(legend).to_have_count(2)
    assert sorted(legend.all_text_contents()) == ["<b>bold run</b>: train loss_0", "<b>bold run</b>: train loss_1"]
    expect(page.locator("table.report-table tbody td")).to_have_text(["<b>bold run</b>", "0.0003"])
    # The links that were javascript: are text now; hovering and clicking them runs nothing.
    for text in ("click me", "raw link", "encoded", "data", "more"):
        page.get_by_text(text, exact=True).click()
    page.get_by_text("styled").hover()
    assert page.locator('#report-body a[href^="javascript:"], #report-body script, #report-body img').count() == 0
    watch.clean()


def test_a_generations_block_says_not_available_when_the_api_answers_404(live_server, user, roots, page):
    run = _run(user, roots, name="measured", lr=3e-4)
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=str(roots / "ckpt"))
    report = services.report_create(user=user, title="gens", body=f"{{{{generations checkpoint={checkpoint.pk}}}}}")
    watch = Watch(page)
    _log_in(page, live_server, user)

    # The checkpoint goes after the page was rendered and before its script asks: the real API answers 404.
    def gone_then_continue(route):
        Checkpoint.objects.filter(pk=checkpoint.pk).delete()
        route.continue_()

    page.route(f"**/api/v1/checkpoints/{checkpoint.pk}/generations/", gone_then_continue)
    page.goto(f"{live_server.url}/reports/{report.pk}/")
    section = page.locator(".report-generations")
    expect(section).to_have_attribute("data-state", "unavailable", timeout=20_000)
    expect(section.locator(".report-generations-state")).to_have_text(
        f"Generations are not available for checkpoint {checkpoint.pk}: the server has none for it (or no generations API).")
    # Chromium logs the 404 itself as a console error: that one is expected, nothing else.
    assert watch.dialogs == [] and all("404" in e for e in watch.errors), watch.errors


def test_the_export_opens_from_disk_offline_with_its_table_and_chart(live_server, user, roots, page, tmp_path):
    run = _run(user, roots, name="shared run", lr=2e-4)
    report = services.report_create(user=user, title="Shared findings", body=(
        f"Loss fell **steadily**.\n\n{{{{table runs={run.pk} columns=name,learning_rate}}}}\n\n"
        f"{{{{chart run={run.pk} metric=loss_0}}}}\n"))
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/reports/{report.pk}/")
    with page.expect_download() as download:
        page.click("#report-export")
    path = tmp_path / "report.html"
    download.value.save_as(path)

    page.context.set_offline(True)
    asked = []
    page.on("request", lambda request: asked.append(request.url))
    watch = Watch(page)
    page.goto(path.as_uri())
    expect(page.locator("#report-title")).to_have_text("Shared findings")
    expect(page.locator("#report-body strong")).to_have_text("steadily")
    expect(page.locator("table.report-table tbody td")).to_have_text(["shared run", "0.0002"])
    chart = page.locator("figure.report-chart svg.report-svg")
    expect(chart).to_be_visible()
    expect(chart.locator("polyline.series")).to_have_count(1)
    expect(chart.locator("text.legend")).to_have_text(["shared run: train loss_0"])
    # Ten points, the loss falling: the line's y (downwards in SVG) grows from left to right.
    points = chart.locator("polyline.series").get_attribute("points").split()
    ys = [float(p.split(",")[1]) for p in points]
    assert len(points) == 10 and ys == sorted(ys) and ys[0] < ys[-1]
    assert asked == [path.as_uri()]
    watch.clean()


def test_writing_a_report_previews_its_blocks_then_saves_a_new_version(live_server, user, roots, page):
    run = _run(user, roots, name="drafted", lr=3e-4)
    report = services.report_create(user=user, title="Draft", body="first words")
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/reports/{report.pk}/edit/")
    expect(page.locator("#id_body")).to_have_value("first words")
    page.fill("#id_body", f"Second take.\n\n{{{{chart run={run.pk} metric=loss split=train}}}}\n\n{{{{chart run=1 metric=x y}}}}\n")
    page.click("#report-preview-button")
    expect(page.locator("#report-body figure.report-chart")).to_have_attribute("data-drawn", "1", timeout=20_000)
    expect(page.locator("#report-body .report-error")).to_contain_text("chart: 'y' is not name=value")
    assert selectors.report_version(report=report).number == 1  # a preview stores nothing
    page.click("#report-save")
    expect(page.locator("#report-meta")).to_contain_text("Version 2 of 2")
    expect(page.locator("#report-body p").first).to_have_text("Second take.")
    watch.clean()
