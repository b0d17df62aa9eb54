"""Strings from data are text on every page, under the Content-Security-Policy, in headless Chromium: a
run whose name, tags and metric keys are markup (stored straight into the database, as data from before
the metric-name rule might be) opens on its page, in compare, in the runs list and on a sweep's page
with no dialog, no script of it run, the markup shown as typed where the name or key is shown, and no
console error (a CSP violation is one)."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.models import Evaluation, PipelineRun, StageStatus, RunTag, SweepRun
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary
from runs.tracking.reported_points import points_report
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NAME = "<img src=x onerror=alert(1)>"
TAG = '"><svg onload=alert(2)>'
KEYS = ["loss<img src=x onerror=alert(71)>", '"><svg onload=alert(3)>', '<a href="javascript:alert(4)">x</a>']


class Watch:
    """Every dialog (alert, confirm) a page opens and every console error or uncaught exception it has."""

    def __init__(self, page):
        self.dialogs, self.errors = [], []
        page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def clean(self) -> None:
        assert self.dialogs == [] and self.errors == [], (self.dialogs, self.errors)


def _hostile_run(user, roots, *, steps: int = 5):
    run = _training_run(user, roots, name="hostile", steps=steps)
    PipelineRun.objects.filter(pk=run.pk).update(name=NAME)
    RunTag.objects.create(name=TAG).runs.add(run)
    # points_report stores what points_check let through: called alone it takes keys the API refuses.
    points_report(training_run_id=run.training_run.pk, points=[
        {"key": key, "split": split, "step": step, "value": 1.0 / step, "epoch": step / 100}
        for key in KEYS for split in ("train", "val") for step in range(1, steps + 1)])
    return run


def _legend_texts(page, plot_id: str) -> list[str]:
    return page.evaluate("(id) => [...document.getElementById(id).querySelectorAll('.legendtext')].map(t => t.textContent)",
                         plot_id)


def test_the_run_page_shows_markup_in_names_tags_and_keys_as_text(live_server, user, roots, page):
    run = _hostile_run(user, roots)
    watch = Watch(page)
    _log_in(page, live_server, user)
    response = page.goto(f"{live_server.url}/runs/{run.pk}/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator("h1")).to_contain_text(NAME)
    expect(page.locator('#tags-form input[name="tags"]')).to_have_value(TAG)
    # Each hostile key's family gets its chart; its export list names the key as text, with links to it.
    family = KEYS[0]  # no _<digits> suffix: the key is its own family
    plot = page.locator(f'[id="plot-{family}"]')
    expect(plot.locator(".main-svg").first).to_be_visible(timeout=20_000)
    exports = plot.locator("xpath=..").locator(".export li")
    expect(exports).to_have_count(2)
    expect(exports.first).to_contain_text(f"train {family} (5 points): CSV JSON")
    href = exports.first.locator("a").first.get_attribute("href")
    assert href.startswith(f"/api/v1/runs/{run.pk}/metrics/export/?key=loss%3Cimg") and href.endswith("format=csv")
    assert f"train {family}" in _legend_texts(page, f"plot-{family}")
    # The link-shaped key drew no link: plotly's legend shows it as typed.
    assert f"val {KEYS[2]}" in _legend_texts(page, f"plot-{KEYS[2]}")
    assert page.evaluate("(id) => document.getElementById(id).querySelectorAll('a').length", f"plot-{KEYS[2]}") == 0
    assert page.locator('a[href^="javascript:"]').count() == 0
    assert page.locator("img[src=x], svg[onload]").count() == 0
    # plotly's own CSS got in without an inline <style>: through CSSOM, into app.css's sheet (base.html).
    assert page.evaluate("[...document.getElementById('plotly.js-style-global').sheet.cssRules]"
                         ".some(r => (r.selectorText || '').includes('.js-plotly-plot .plotly .modebar'))")
    watch.clean()


def test_compare_and_the_runs_list_show_markup_as_text(live_server, user, roots, page):
    hostile = _hostile_run(user, roots)
    other = _training_run(user, roots, name="plain", steps=5)
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/compare/?ids={hostile.pk},{other.pk}")
    expect(page.locator("#compare-loss .main-svg").first).to_be_visible(timeout=20_000)
    expect(page.locator("table").first).to_contain_text(NAME)
    # The series picker: a box per key, the key its label's text and its data-key as typed.
    for key in KEYS:
        box = page.locator("#compare-series label").filter(has_text=key)
        expect(box).to_have_count(1)
        assert box.locator("input").get_attribute("data-key") == key
    legend = _legend_texts(page, f'compare-{KEYS[0]}')
    assert f"{NAME}: train {KEYS[0]}" in legend
    assert page.locator('a[href^="javascript:"]').count() == 0
    assert page.locator("img[src=x], svg[onload]").count() == 0

    page.goto(f"{live_server.url}/")
    row = page.locator(f'tr[data-run="{hostile.pk}"]')
    expect(row).to_contain_text(NAME)
    expect(row.locator("a.tag")).to_have_text(TAG)
    assert page.locator("img[src=x], svg[onload]").count() == 0
    watch.clean()


def test_a_sweep_page_shows_markup_in_its_name_and_runs_as_text(live_server, user, roots, page):
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(draft_vocab_size=64, max_samples=30), name=TAG,
                         varied=[parse_vary("lr=1e-4,3e-4")])
    ids = list(SweepRun.objects.filter(sweep=sweep).order_by("position").values_list("run_id", flat=True))
    PipelineRun.objects.filter(pk=ids[0]).update(name=NAME)
    for stage in STAGES:
        stage.model.objects.filter(run_id=ids[0]).update(status=StageStatus.SUCCEEDED)
    Evaluation.objects.filter(run_id=ids[0]).update(tau=2.5)
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/sweeps/{sweep.pk}/")
    expect(page.locator("h1")).to_contain_text(TAG)
    expect(page.locator(f'#sweep-runs tr[data-run="{ids[0]}"]')).to_contain_text(NAME)
    expect(page.locator('[data-field="best-run"]')).to_have_text(NAME)
    expect(page.locator("#plot-sweep .main-svg").first).to_be_visible(timeout=20_000)
    assert page.evaluate("document.getElementById('plot-sweep').data.map(t => t.y.length)") == [1, 1]
    assert page.locator("img[src=x], svg[onload]").count() == 0
    watch.clean()
