"""The run page's live chart in headless Chromium (static/js/runs/curves.js): after its one whole read it asks only
for the steps after the newest it holds, merges them, asks a series that took points behind that step (a
validation) again from its own last step, and once a series holds twice the points it draws, thins it in the
page, keeping each step span's lowest and highest point: the spikes stay drawn after many polls."""
from __future__ import annotations

import re

import pytest

from runs.tracking.services import metrics_record
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
LOSS_0 = "(document.getElementById('plot-loss')?.data || []).find((t) => t.name === 'train loss_0')"


def _loss_0(steps, spikes):
    return [{"split": "train", "key": "loss_0", "step": s, "epoch": s / 1000, "value": spikes.get(s, 1.0 + (s % 7) / 100)}
            for s in steps]


def test_the_live_chart_gains_new_points_and_keeps_its_spikes(live_server, user, roots, page):
    run = _training_run(user, roots, name="live chart", steps=40)
    training_id = run.training_run.pk
    metrics_record(training_run_id=training_id, points=_loss_0(range(41, 3901), {1000: 50.0}))
    asked = []
    # The curves' reads, and the one poll that brings the new points with the status (runs.api.views.run_poll).
    page.on("request", lambda r: asked.append(r.url) if "/metrics/" in r.url or "curves_start=" in r.url else None)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    # The whole read: 3,900 points drawn as 2,000 by the server (MinMaxLTTB), the spike among them.
    page.wait_for_function(f"{LOSS_0} && {LOSS_0}.y.includes(50)", timeout=20_000)
    assert page.evaluate(f"{LOSS_0}.x.length") == 2000

    def arrive(points, last):
        metrics_record(training_run_id=training_id, points=points)
        page.wait_for_function(f"{LOSS_0}.x.includes({last})", timeout=30_000)

    arrive(_loss_0(range(3901, 4901), {}), 4900)
    # A validation at a step the training already passed: the poll from 4,901 does not hold it; its count says
    # so and the page asks that series again from its own last step.
    metrics_record(training_run_id=training_id, points=[
        {"split": "val", "key": "full_acc_0", "step": 4000, "epoch": 4.0, "value": 0.75}])
    arrive(_loss_0(range(4901, 5901), {5500: 77.0}), 5900)
    page.wait_for_function("(document.getElementById('plot-full_acc')?.data || []).some("
                           "(t) => t.name === 'val full_acc_0' && t.x.includes(4000))", timeout=30_000)
    # 4,000 points held: the next poll's points make the page thin the series to about 2,000.
    arrive(_loss_0(range(5901, 6001), {5950: -5.0}), 6000)
    x, y = page.evaluate(f"[{LOSS_0}.x, {LOSS_0}.y]")
    assert len(x) <= 2002 and x == sorted(x) and x[0] == 1 and x[-1] == 6000
    assert {50.0, 77.0, -5.0} <= set(y)  # every spike, from the whole read and from three polls
    # Only the first read was whole: the rest asked from the step after the newest held (or a catch-up).
    whole = [u for u in asked if re.search(r"/metrics/\?points=2000$", u)]
    polls = [u for u in asked if "start=" in u]
    assert len(whole) == 1 and len(polls) >= 3, asked
    assert any("keys=full_acc_0&split=val&start=41" in u for u in polls), asked
