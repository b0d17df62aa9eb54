"""A run trained elsewhere on its page in headless Chromium: the badge and the word that it reports from
elsewhere, its reported curves drawn, and the points and step its client sends next drawn by the page's
polls, with no error in the console."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.pipeline.launch.external import external_points_report, external_run_create
from tests.browser.every_page.test_pages_at_a_glance import _log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _points(steps, value=lambda step: 3.0 - step / 100):
    return [{"key": f"loss_{k}", "split": "train", "step": step, "value": value(step) + k} for step in steps
            for k in range(2)]


def test_the_run_page_draws_what_a_run_trained_elsewhere_reports(live_server, user, page):
    run = external_run_create(user=user, name="on the cluster", config={"epochs": 2, "lr": 0.0001})
    external_points_report(run=run, user=user, points=_points(range(0, 21, 10)))
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#external-note")).to_contain_text("reports from elsewhere")
    expect(page.locator('[data-glance="reported_step"]')).to_have_text("20")
    page.wait_for_function("document.getElementById('plot-loss') && document.getElementById('plot-loss').data"
                           " && document.getElementById('plot-loss').data[0].x.join(',') === '0,10,20'",
                           timeout=20_000)
    assert page.evaluate("document.getElementById('plot-loss').data[0].y") == [3.0, 2.9, 2.8]
    # Its client sends more: the polls draw them and the header follows.
    external_points_report(run=run, user=user, points=_points([30]))
    page.wait_for_function("document.getElementById('plot-loss').data[0].x.includes(30)", timeout=15_000)
    expect(page.locator('[data-glance="reported_step"]')).to_have_text("30", timeout=15_000)
    page.goto(f"{live_server.url}/")
    expect(page.locator(f'tr[data-run="{run.pk}"] .badge.external')).to_have_text("external")
    assert errors == []
