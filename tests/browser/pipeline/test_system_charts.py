"""The run page's System charts in headless Chromium: the samples a worker's meter took (here this test
process's, measured by workers.orchestration.system_metrics and written through the same service) drawn against wall
time, one chart per figure, and a sample written later drawn by the page's poll, with no console error."""
from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from runs.models import MetricSeries
from runs.tracking.services import system_samples_record
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run
from workers.orchestration.system_metrics import SystemMeter, series_values

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _write(meter: SystemMeter, training_run_id: int) -> dict:
    sample = meter.sample()
    system_samples_record(training_run_id=training_run_id,
                          samples=[{"time": sample["time"], "values": series_values(sample)}])
    return sample


def test_the_system_charts_draw_the_sampled_figures_by_time_and_follow_new_ones(live_server, user, roots, page):
    run = _training_run(user, roots, name="sampled", steps=40)
    meter = SystemMeter()
    samples = []
    for _ in range(4):
        samples.append(_write(meter, run.training_run.pk))
        time.sleep(0.3)
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    # CPU: the first sample has no rate, so three points; memory: four. x is the samples' wall time.
    page.wait_for_function("document.getElementById('plot-system-cpu') && document.getElementById('plot-system-cpu').data"
                           " && document.getElementById('plot-system-cpu').data.length === 2", timeout=20_000)
    cpu = page.evaluate("document.getElementById('plot-system-cpu').data.map(t => [t.name, t.x.length, t.y])")
    assert sorted(name for name, _, _ in cpu) == ["the host", "the stage's processes"]
    stage_cpu = next(y for name, _, y in cpu if name == "the stage's processes")
    assert stage_cpu == pytest.approx([s["cpu_percent"] for s in samples[1:]])
    memory_x = page.evaluate("document.getElementById('plot-system-memory').data[0].x.map(x => new Date(x).getTime())")
    assert memory_x == [pytest.approx(s["time"] * 1000, abs=1) for s in samples]
    expect(page.locator("#plot-system-memory .main-svg").first).to_be_visible()
    expect(page.locator("#system-status")).to_be_hidden()
    gpu_series = MetricSeries.objects.filter(training_run=run.training_run, key__startswith="system/gpu").exists()
    assert page.locator("#plot-system-gpu_util").count() == (1 if gpu_series else 0)
    # The curves stay as they were: no system series among the training's charts.
    expect(page.locator("#plot-loss .main-svg").first).to_be_visible(timeout=20_000)
    assert "system" not in page.evaluate("Object.keys(document.getElementById('plot-loss').data.map(t => t.name))")

    _write(meter, run.training_run.pk)  # the poll (every 5 s) draws it
    page.wait_for_function("document.getElementById('plot-system-memory').data[0].x.length === 5", timeout=20_000)
    assert page.locator("#system-charts").get_attribute("data-points") is not None
    assert errors == []
