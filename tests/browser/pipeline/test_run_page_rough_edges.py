"""The run page's rough edges of issue 28, in headless Chromium: epochs counted from 1 wherever a page
names one (the checkpoints table, the best's sentence, the runs list's "best 1 of 1", a checkpoint's page),
the summed train loss on a chart of its own (on loss_0..2's it squashed them), and the run's end said beside
the current stage's ETA, with why it cannot be said yet."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.models import Checkpoint, TrainingRun
from tests.browser.tracking.test_compare_rough_edges import _with_summed_loss
from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_epochs_count_from_1_the_summed_loss_has_its_chart_and_the_runs_end_is_said(live_server, user, roots, page):
    run = _with_summed_loss(_training_run(user, roots, name="one epoch", steps=30), 30)
    TrainingRun.objects.filter(run=run).update(epochs=1, best_epoch=0)
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, is_best=True, val_loss=1.5,
                                           path=f"{run.output_dir}/checkpoints/0")
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    # The trainer's first epoch is its epoch 0: the page says 1.
    first = page.locator("#checkpoint-table tbody tr").first.locator("td").first
    expect(first).to_contain_text("1")
    expect(first).not_to_contain_text("0")
    expect(page.locator("#best-choice")).to_contain_text("epoch 1 (validation loss 1.5000)")
    # Training runs and nothing on this target was measured before: the run's end cannot be said yet.
    expect(page.locator('[data-glance="run_eta"]')).to_have_text("–")
    expect(page.locator('[data-glance="run_eta_note"]')).to_have_text(
        "(Measure acceptance has not started: its length is unknown until it reports progress)")
    page.wait_for_function("document.getElementById('plot-loss_sum') && document.getElementById('plot-loss_sum').data",
                           timeout=20_000)
    names = lambda plot: page.evaluate(f"document.getElementById('{plot}').data.map(t => t.name)")  # noqa: E731
    assert sorted(set(names("plot-loss"))) == ["train loss_0", "train loss_1", "train loss_2"]
    assert set(names("plot-loss_sum")) == {"train loss"}
    page.goto(f"{live_server.url}/")
    expect(page.locator(f'tr[data-run="{run.pk}"]')).to_contain_text("best 1 of 1")
    page.goto(f"{live_server.url}{checkpoint.get_absolute_url()}")
    expect(page.locator("main")).to_contain_text("Epoch 1 of")
    watch.clean()
