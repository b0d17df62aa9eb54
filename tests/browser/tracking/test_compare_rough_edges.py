"""The compare page's rough edges of issue 28, in headless Chromium under the Content-Security-Policy: its
charts on the first screen (and a jump to each part), an empty chart that says it is empty, the learning rate
in significant digits, a colour per run that does not move with the other runs compared, and a run trained
elsewhere that neither vanishes (x = tokens seen) nor stands on vertical lines (x = epoch)."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.pipeline.launch.external import external_points_report, external_run_create
from runs.tracking.services import metrics_record
from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TRACES = "(id) => (document.getElementById(id).data || []).map(t => [t.name, t.line.color, t.x])"


def _with_summed_loss(run, steps):
    """The trainer's summed loss beside loss_0..2 (about 3x each), as the demo's trainer logs it."""
    metrics_record(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": "loss", "step": s, "epoch": s / 100, "value": 12.0 / (1 + 0.05 * s)}
        for s in range(1, steps + 1)])
    return run


def _external(user):
    """A run trained elsewhere that reports whole epochs (0 for steps 1-10, 1 for 11-20) and no tokens_seen."""
    run = external_run_create(user=user, name="on the cluster", config={"epochs": 2, "lr": 0.0001})
    external_points_report(run=run, user=user, points=[
        {"key": "loss_0", "split": "train", "step": s, "epoch": (s - 1) // 10, "value": 3.0 - s / 100}
        for s in range(1, 21)])
    return run


def _open(page, live_server, ids, *, height=900):
    page.set_viewport_size({"width": 1280, "height": height})
    page.goto(f"{live_server.url}/runs/compare/?ids={','.join(str(i) for i in ids)}")
    expect(page.locator("#compare-plots")).to_have_attribute("data-drawn", "1", timeout=20_000)


def test_charts_on_the_first_screen_lr_in_significant_digits_and_an_empty_chart_says_so(live_server, user, roots, page):
    a = _with_summed_loss(_training_run(user, roots, name="a", steps=30), 30)
    b = _training_run(user, roots, name="b", steps=20, lr_scale=0.1)
    watch = Watch(page)
    _log_in(page, live_server, user)
    _open(page, live_server, [a.pk, b.pk])
    # A laptop's screen (900 px): the first chart starts on it, not two screens down.
    assert page.locator("#compare-loss").bounding_box()["y"] < 900
    for target in ("charts", "differ", "curve-summary", "acceptance", "loss-tau"):
        assert page.locator(f'#compare-jumps a[href="#{target}"]').count() == 1 and page.locator(f"#{target}").count() == 1
    # lr of run b: 3e-6 at step 1, 3e-5 from step 10 on; four decimals printed "0.0000 · 0.0000 · 0.0000".
    lr_b = page.locator("#compare-metrics tr", has_text="train lr").locator("td").nth(1)
    expect(lr_b).to_have_text("3e-05 · 3e-06 · 3e-05")
    # The summed loss has its own chart: loss_0..2 keep theirs, at their own scale.
    loss = page.evaluate(TRACES, "compare-loss")
    assert sorted(name.split(": ")[1] for name, _, _ in loss) == ["train loss_0"] * 2 + ["train loss_1"] * 2 + \
        ["train loss_2"] * 2
    assert [name for name, _, _ in page.evaluate(TRACES, "compare-loss_sum")] == ["a: train loss"]
    # Every series unticked: each chart says so instead of drawing empty axes.
    for box in page.locator("#compare-series input[type=checkbox]").all():
        box.uncheck()
    expect(page.locator("#compare-loss")).to_have_text(
        "loss: no series shown. Tick one of its series under Series.")
    expect(page.locator("#compare-lr")).to_contain_text("no series shown")
    assert page.locator("#compare-plots .main-svg").count() == 0
    page.locator('#compare-series input[data-key="loss_1"]').check()
    expect(page.locator("#compare-loss .main-svg").first).to_be_visible()
    watch.clean()


def test_a_run_keeps_its_colour_whichever_runs_it_is_compared_with(live_server, user, roots, page):
    a = _training_run(user, roots, name="a", steps=5)
    b = _training_run(user, roots, name="b", steps=5)
    c = _training_run(user, roots, name="c", steps=5)
    watch = Watch(page)
    _log_in(page, live_server, user)

    def colours(ids):
        _open(page, live_server, ids)
        return {name.split(": ")[0]: colour for name, colour, _ in page.evaluate(TRACES, "compare-loss")}

    first, second = colours([a.pk, c.pk]), colours([b.pk, c.pk])
    assert first["c"] == second["c"]  # c was second in both, yet by position it was the second colour only
    assert colours([c.pk, a.pk])["a"] == first["a"]
    assert len({first["a"], second["b"], first["c"]}) == 3
    watch.clean()


def test_a_run_trained_elsewhere_is_placed_by_epoch_or_said_why_not_by_tokens(live_server, user, roots, page):
    here = _training_run(user, roots, name="here", steps=20)
    there = _external(user)
    watch = Watch(page)
    _log_in(page, live_server, user)
    _open(page, live_server, [here.pk, there.pk])
    page.select_option("#compare-x", "tokens")
    expect(page.locator("#compare-unplaced")).to_have_text(
        "on the cluster is not drawn against this x axis: it reported no tokens_seen series; x = step or wall time "
        "places its points.")
    page.select_option("#compare-x", "epoch")
    expect(page.locator("#compare-unplaced")).to_be_hidden()
    xs = {name: x for name, _, x in page.evaluate(TRACES, "compare-loss")}
    spread = xs["on the cluster: train loss_0"]
    # Epoch 0 ran steps 1-10, epoch 1 steps 11-20: 10 steps an epoch, so step s sits at (s - 1) / 10.
    assert spread == pytest.approx([(s - 1) / 10 for s in range(1, 21)])
    assert xs["here: train loss_0"][:3] == pytest.approx([0.01, 0.02, 0.03])  # a run of ours: its own fractions
    watch.clean()
