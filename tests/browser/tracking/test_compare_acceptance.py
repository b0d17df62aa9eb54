"""Compare's acceptance table in headless Chromium, under the Content-Security-Policy: choosing another
baseline run in its select changes every delta and colour (static/js/compare/acceptance_heatmap.js asks
GET /api/v1/compare/acceptance/), and a reload keeps the choice, with no console error. The runs are those of
tests/views/tracking/test_compare_acceptance.py: A (k=3, best epoch 2: 80, 60, 40 %) and B (k=2, best epoch 1:
78, 52 %)."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.views.tracking.test_compare_acceptance import A, B, _measured_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_baseline_select_changes_the_deltas(live_server, user, roots, page):
    a, _ = _measured_run(user, roots, A)
    b, _ = _measured_run(user, roots, B)
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/compare/?ids={a.pk},{b.pk}")
    row_a, row_b = (page.locator(f'#acceptance-heatmap tr[data-run="{run.pk}"]') for run in (a, b))
    cell = lambda row, position: row.locator(f'td[data-position="{position}"]')  # noqa: E731

    # Against A, the first run: B is 2 and 8 points below it, blank past its k.
    expect(page.locator("#acceptance-baseline")).to_have_value(str(a.pk))
    expect(row_a).to_have_class("baseline")
    expect(cell(row_a, 1).locator(".acc-delta")).to_have_text("baseline")
    expect(cell(row_b, 1).locator(".acc-delta")).to_have_text("−2.0 pp")
    expect(cell(row_b, 1)).to_have_class("acc acc-down-2")
    expect(cell(row_b, 2).locator(".acc-delta")).to_have_text("−8.0 pp")
    expect(cell(row_b, 3)).to_have_class("acc acc-blank")

    # Against B: A is 2 and 8 points above it; B has no third position to compare A's with.
    page.select_option("#acceptance-baseline", str(b.pk))
    expect(cell(row_a, 1).locator(".acc-delta")).to_have_text("+2.0 pp")
    expect(cell(row_a, 1)).to_have_class("acc acc-up-2")
    expect(cell(row_a, 2).locator(".acc-delta")).to_have_text("+8.0 pp")
    expect(cell(row_a, 2)).to_have_class("acc acc-up-3")
    expect(cell(row_a, 3).locator(".acc-delta")).to_have_text("no baseline")
    expect(cell(row_b, 1).locator(".acc-delta")).to_have_text("baseline")
    expect(cell(row_b, 1)).to_have_class("acc acc-base")
    expect(row_b).to_have_class("baseline")
    expect(row_a).not_to_have_class("baseline")
    expect(page.locator("#acceptance-baseline-name")).to_have_text(str(b))
    # The values themselves never change with the baseline.
    expect(cell(row_a, 1).locator(".acc-value")).to_have_text("80.0 %")
    expect(page.locator("#compare-tau .main-svg").first).to_be_visible(timeout=20_000)
    # The choice is in the address: a reload (or the link shared) draws B's deltas from the server.
    assert f"baseline={b.pk}" in page.url
    page.reload()
    expect(page.locator("#acceptance-baseline")).to_have_value(str(b.pk))
    expect(cell(row_a, 2).locator(".acc-delta")).to_have_text("+8.0 pp")
    expect(row_b).to_have_class("baseline")
    watch.clean()


def test_a_baseline_that_cannot_be_shown_is_said_and_the_table_keeps_the_last(live_server, user, roots, page):
    """B's measurement goes while the page is open (its evaluate stage is measured again and fails to
    record a τ): choosing B says why, the select returns to A whose deltas the table still shows, and
    choosing B again, once measured, works."""
    from runs.models import Evaluation

    a, _ = _measured_run(user, roots, A)
    b, _ = _measured_run(user, roots, B)
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/compare/?ids={a.pk},{b.pk}")
    row_b = page.locator(f'#acceptance-heatmap tr[data-run="{b.pk}"]')
    tau = Evaluation.objects.get(run=b).tau
    Evaluation.objects.filter(run=b).update(tau=None)

    page.select_option("#acceptance-baseline", str(b.pk))
    expect(page.locator("#acceptance-status")).to_contain_text(f"baseline: run {b.pk} has no measured acceptance")
    expect(page.locator("#acceptance-status")).to_contain_text("Choose it again to retry")
    expect(page.locator("#acceptance-baseline")).to_have_value(str(a.pk))
    expect(row_b.locator('td[data-position="1"] .acc-delta')).to_have_text("−2.0 pp")  # still against A

    # Measured again meanwhile (B's first position now 70 %): the table shows the value its deltas are from.
    Evaluation.objects.filter(run=b).update(tau=tau, acceptance_per_position=[0.70, 0.52])
    page.select_option("#acceptance-baseline", str(b.pk))
    expect(row_b.locator('td[data-position="1"] .acc-delta')).to_have_text("baseline")
    expect(row_b.locator('td[data-position="1"] .acc-value')).to_have_text("70.0 %")
    row_a = page.locator(f'#acceptance-heatmap tr[data-run="{a.pk}"]')
    expect(row_a.locator('td[data-position="1"] .acc-delta')).to_have_text("+10.0 pp")
    expect(page.locator("#acceptance-status")).to_have_text("")
    # The refused request is the only console line (Chromium logs a 4xx answer); no script error, no dialog.
    assert watch.dialogs == [] and all("400 (Bad Request)" in error for error in watch.errors), watch.errors
