"""No main page scrolls sideways at 1,280 px: the document is never wider than the window, in headless
Chromium with each page's live parts drawn (the run page's curves and System charts among them)."""
from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from runs.pipeline.launch.run_config import RunConfig
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary
from runs.tracking.services import system_samples_record
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run
from workers.orchestration.system_metrics import SystemMeter, series_values

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WIDTH = 1280
# The outermost elements that reach past the window's right edge, for the failure's message.
OVERFLOWING = """(() => {
  const limit = document.documentElement.clientWidth, out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const parent = el.parentElement;
    if (el.getBoundingClientRect().right > limit + 1 && !(parent && parent.getBoundingClientRect().right > limit + 1))
      out.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}.${el.className} (${Math.round(el.getBoundingClientRect().right)} px)`);
  }
  return out.slice(0, 5);
})()"""


def _sampled(training_run_id: int) -> None:
    meter = SystemMeter()
    for _ in range(3):
        sample = meter.sample()
        system_samples_record(training_run_id=training_run_id,
                              samples=[{"time": sample["time"], "values": series_values(sample)}])
        time.sleep(0.2)


def test_no_main_page_scrolls_sideways_at_1280_px(live_server, user, roots, page):
    page.set_viewport_size({"width": WIDTH, "height": 900})
    run = _training_run(user, roots, name="a run whose page shows every chart", steps=40)
    other = _training_run(user, roots, name="its neighbour", steps=20)
    _sampled(run.training_run.pk)
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(draft_vocab_size=64), varied=[parse_vary("seed=1,2")], parallel=1)
    _log_in(page, live_server, user)
    pages = ["/", f"/runs/{run.pk}/", f"/runs/compare/?ids={run.pk},{other.pk}", "/sweeps/",
             f"/sweeps/{sweep.pk}/", "/workers/", "/datasets/", f"/datasets/{run.dataset_id}/", "/extractions/",
             "/alerts/", "/alerts/rules/", "/reports/", "/account/", "/runs/new/"]
    wide = {}
    for path in pages:
        response = page.goto(live_server.url + path)
        assert response.status == 200, path
        page.wait_for_load_state("networkidle")
        if path == f"/runs/{run.pk}/":
            expect(page.locator("#plot-system-memory .main-svg").first).to_be_visible(timeout=20_000)
            expect(page.locator("#plot-loss .main-svg").first).to_be_visible(timeout=20_000)
        widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        if widths[0] > widths[1]:
            wide[path] = [*widths, page.evaluate(OVERFLOWING)]
    assert wide == {}
