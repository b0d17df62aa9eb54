"""A person launches a sweep from the launch form: two learning rates make two runs, one queued and
one held until the first finishes; a real Celery worker runs both; the sweep page shows both with the
swept setting, status and tau, draws tau against the setting, marks the best run and launches it again
with more data."""
import re

import pytest
from playwright.sync_api import expect

from runs.models import PipelineRun, Sweep

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_sweep_from_the_form_runs_both_and_marks_the_best(live_server, worker, user, tiny_target, page, tmp_path):
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")
    page.click("text=Sweeps")
    expect(page.locator("h1")).to_have_text("Sweeps")
    page.click("text=Launch a sweep")
    expect(page.locator("#sweep")).to_have_attribute("open", "")  # the link opens the sweep box

    page.fill("#id_name", "lr sweep")
    page.fill("#id_target_path", str(tiny_target.target_dir))
    page.fill("#id_dataset_path", str(tiny_target.chats_path))
    page.fill("#id_max_samples", "16")
    page.fill("#id_max_seq_len", "256")
    page.fill("#id_draft_vocab_size", "256")
    page.fill("#id_epochs", "1")
    page.fill("#id_ttt_steps", "2")
    page.click("#advanced > summary")
    page.fill("#id_eval_prompts", "2")
    page.fill("#id_eval_max_new_tokens", "16")
    page.fill("#id_vary", "lr = 1e-4, 3e-3")
    expect(page.locator("#launch-submit")).to_have_text("Launch the sweep")
    page.click("#launch-submit")

    expect(page).to_have_url(re.compile(r"/sweeps/\d+/(#sweep)?$"))  # the form's #sweep stays in the URL
    sweep = Sweep.objects.get()
    runs = list(PipelineRun.objects.filter(sweep_entry__sweep=sweep).order_by("sweep_entry__position"))
    assert [r.config["lr"] for r in runs] == [1e-4, 3e-3]
    assert {(r.config["epochs"], r.config["eval_prompts"], r.config["max_samples"]) for r in runs} == {(1, 2, 16)}
    rows = page.locator("#sweep-runs tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator('[data-key="lr"]')).to_have_text("1e-4")
    expect(rows.nth(1).locator('[data-key="lr"]')).to_have_text("3e-3")
    expect(rows.nth(1).locator('[data-field="status"]')).to_have_text("held")  # one at a time in the queue

    # Both finish (the second handed over when the first did); the page reloads itself at the end.
    expect(page.locator('[data-field="measured"]')).to_contain_text("2 of 2 runs measured; the sweep is finished",
                                                                    timeout=420_000)
    taus = [float(rows.nth(i).locator('[data-field="tau"]').inner_text()) for i in range(2)]
    assert all(1.0 <= t <= 3.0 for t in taus)
    best = 0 if round(taus[0], 3) >= round(taus[1], 3) else 1  # the earlier one on a tie
    expect(rows.nth(best).locator('[data-field="best"]')).to_have_text("best τ")
    expect(page.locator("#plot-sweep .main-svg").first).to_be_visible(timeout=20_000)
    points = page.evaluate("document.getElementById('plot-sweep').data.map(t => t.y.length)")
    assert points == [2, 1]  # both runs' tau, and the best starred

    page.screenshot(path=str(tmp_path / "sweep-page.png"), full_page=True)
    page.click("#best-again")
    expect(page).to_have_url(re.compile(rf"/runs/new/\?copy={runs[best].pk}&more_data=1$"))
    expect(page.locator("#id_max_samples")).to_have_value("32")
    expect(page.locator("body")).to_contain_text("max_samples 16 → 32")
