"""The pages an ML engineer keeps open, in headless Chromium against the live server: the run page says
where the run is on its first screen and keeps it live, its curves come before the settings, each
curve of a chart has its own colour and smoothing leaves schedules alone; compare has the same controls
with a colour per run and a style per TTT step and a legend clear of the axes; the runs list is live
and its stage marks are labelled.

The runs' rows and curves are written through the workers' own services (no model runs here; the
pipeline's browser test, test_launch.py, trains one for real)."""
from __future__ import annotations

import time

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.models import StageStatus
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stage_services import stage_progress
from runs.tracking.services import metrics_record
from tests.helpers.fleet import cpu_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FIRST_SCREEN = 900  # px: what a laptop shows without scrolling


def _log_in(page, live_server, user) -> None:
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")


def _training_run(user, roots, *, name: str, steps: int, lr_scale: float = 1.0):
    """A run whose earlier stages succeeded and whose training runs at step `steps` of 100, with
    loss, accuracy (3 TTT steps), lr and tokens_seen curves and one validation point."""
    cpu_worker(probe_queues=False)
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64, ttt_steps=3), name=name, enqueue=False)
    now = timezone.now()
    for stage in ("preparation", "extract_stage", "vocab_mapping"):
        record = getattr(run, stage)
        type(record).objects.filter(pk=record.pk).update(status=StageStatus.SUCCEEDED, started_at=now, finished_at=now)
    training = run.training_run
    # Running as a worker marks it (stage_start would refuse it: this run has no extraction to train on).
    type(training).objects.filter(pk=training.pk).update(status=StageStatus.RUNNING, started_at=now, worker="test",
                                                         lease_expires_at=now + timezone.timedelta(hours=1))
    stage_progress(stage_name="train", record_id=training.pk, done=steps, total=100, log_tail="")
    points = []
    for step in range(1, steps + 1):
        for k in range(3):
            points += [{"split": "train", "key": f"loss_{k}", "step": step, "epoch": step / 100,
                        "value": 4.0 / (1 + 0.05 * step) + 0.3 * k + 0.2 * ((step * 7 + k) % 5) / 5},
                       {"split": "train", "key": f"full_acc_{k}", "step": step, "epoch": step / 100,
                        "value": min(0.9, 0.01 * step) / (k + 1)}]
        points += [{"split": "train", "key": "lr", "step": step, "epoch": step / 100,
                    "value": lr_scale * 3e-4 * min(1.0, step / 10)},
                   {"split": "train", "key": "tokens_seen", "step": step, "epoch": step / 100, "value": 512.0 * step}]
    points += [{"split": "val", "key": f"full_acc_{k}", "step": steps, "epoch": 1.0, "value": 0.5 / (k + 1)}
               for k in range(3)]
    metrics_record(training_run_id=training.pk, points=points)
    return run


def test_the_run_page_says_where_the_run_is_on_its_first_screen(live_server, user, roots, page):
    run = _training_run(user, roots, name="glance", steps=40)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")

    glance = page.locator("#glance")
    expect(glance).to_be_visible()
    assert glance.bounding_box()["y"] < 300
    expect(page.locator('[data-glance="stage"]')).to_have_text("Train draft")
    expect(page.locator('[data-glance="train_step"]')).to_have_text("40 of 100")
    # The latest recorded values, per TTT step (step 40: 4/(1+2) + 0.3k + 0.2*((280+k)%5)/5).
    expect(page.locator('[data-glance="loss"]')).to_have_text("1.333 · 1.673 · 2.013")
    expect(page.locator('[data-glance="acc"]')).to_have_text("0.500 · 0.250 · 0.167 (val)")
    # The curves are on the first screen; the settings are folded below them.
    expect(page.locator("#plot-loss .main-svg").first).to_be_visible(timeout=20_000)
    assert page.locator("#plot-loss").bounding_box()["y"] < FIRST_SCREEN
    assert page.locator("#settings").get_attribute("open") is None
    assert page.locator("#settings").bounding_box()["y"] > page.locator("#curves").bounding_box()["y"]
    # The legend stays clear of the plot and of its x axis title.
    legend = page.locator("#plot-full_acc .legend").bounding_box()
    x_title = page.locator("#plot-full_acc .g-xtitle").bounding_box()
    plot_area = page.locator("#plot-full_acc .nsewdrag").first.bounding_box()
    assert legend["x"] >= plot_area["x"] + plot_area["width"] and legend["x"] >= x_title["x"] + x_title["width"]
    # Each curve of a chart has its own colour.
    colours = page.evaluate("document.getElementById('plot-loss').data.map(t => t.line.color)")
    assert len(colours) == 3 and len(set(colours)) == 3
    # Smoothing smooths the losses, never the learning-rate schedule.
    lr_before = page.evaluate("document.getElementById('plot-lr').data.map(t => t.y)")
    loss_before = page.evaluate("document.getElementById('plot-loss').data[0].y")
    page.locator("#curve-smooth").fill("0.9")
    page.locator("#curve-smooth").dispatch_event("input")
    assert page.evaluate("document.getElementById('plot-lr').data.map(t => t.y)") == lr_before
    smoothed = page.evaluate("document.getElementById('plot-loss').data.filter(t => t.line.width === 2)[0].y")
    assert smoothed != loss_before and len(smoothed) == len(loss_before)

    # Live: a new step and its points reach the header without a reload.
    training = run.training_run
    stage_progress(stage_name="train", record_id=training.pk, done=41, total=100, log_tail="")
    metrics_record(training_run_id=training.pk, points=[
        {"split": "train", "key": f"loss_{k}", "step": 41, "epoch": 0.41, "value": 0.5 + k} for k in range(3)])
    expect(page.locator('[data-glance="train_step"]')).to_have_text("41 of 100", timeout=15_000)
    expect(page.locator('[data-glance="loss"]')).to_have_text("0.500 · 1.500 · 2.500", timeout=15_000)


def test_compare_has_the_run_page_controls_and_a_legend_clear_of_the_axes(live_server, user, roots, page):
    first = _training_run(user, roots, name="short", steps=15)
    second = _training_run(user, roots, name="long", steps=60, lr_scale=2.0)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/compare/?ids={first.pk},{second.pk}")
    expect(page.locator("#compare-loss .main-svg").first).to_be_visible(timeout=20_000)
    traces = page.evaluate("document.getElementById('compare-loss').data.map(t => [t.name, t.line.color, t.line.dash])")
    assert len(traces) == 6
    by_run = {name.split(":")[0]: set() for name, _, _ in traces}
    for name, colour, dash in traces:
        by_run[name.split(":")[0]].add(colour)
    assert all(len(c) == 1 for c in by_run.values()) and len(set.union(*by_run.values())) == 2  # a colour per run
    assert {dash for name, _, dash in traces if name.startswith(f"{first}")} == {"solid", "dash", "dot"}  # per TTT step
    # The legend never covers the plot area or the x axis title.
    legend = page.locator("#compare-loss .legend").bounding_box()
    plot_area = page.locator("#compare-loss .nsewdrag").first.bounding_box()
    x_title = page.locator("#compare-loss .g-xtitle").bounding_box()
    assert legend["x"] >= plot_area["x"] + plot_area["width"]
    assert legend["x"] >= x_title["x"] + x_title["width"] or legend["y"] + legend["height"] <= x_title["y"]
    # x by tokens seen: the long run's last point is at 60 * 512 tokens.
    page.select_option("#compare-x", "tokens")
    xs = page.evaluate("document.getElementById('compare-loss').data.map(t => Math.max(...t.x))")
    assert max(xs) == pytest.approx(60 * 512)
    # Log scale, and the series picker hides a TTT step.
    page.check("#compare-log")
    assert page.evaluate("document.getElementById('compare-loss').layout.yaxis.type") == "log"
    page.uncheck('#compare-series input[data-key="loss_2"]')
    assert page.evaluate("document.getElementById('compare-loss').data.length") == 4


def test_the_runs_list_is_live_and_its_stage_marks_are_labelled(live_server, user, roots, page):
    run = _training_run(user, roots, name="live-list", steps=5)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/")
    row = page.locator(f'tr[data-run="{run.pk}"]')
    expect(row.locator(".stage-pill")).to_have_text(["prepare", "extract", "vocab", "train", "evaluate"])
    expect(row.locator(".stage-pill.running")).to_have_text("train")
    duration = row.locator("td[data-running-since]")
    first = duration.inner_text()
    time.sleep(2.2)
    assert duration.inner_text() != first  # it ticks
    # The training finishes on the server: the row follows without a reload.
    from runs.pipeline.lifecycle.stage_services import stage_succeed

    stage_succeed(stage_name="train", record_id=run.training_run.pk, fields={}, log_tail="")
    expect(row.locator(".stage-pill.succeeded")).to_have_count(4, timeout=15_000)
    box = row.locator("td:nth-child(2)").bounding_box()
    assert box["height"] < 45  # the name is not wrapped onto three lines
