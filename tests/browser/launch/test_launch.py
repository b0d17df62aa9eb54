"""A person logs in, launches a run with the form, and watches it finish with plotted curves,
in headless Chromium against the live server and a real Celery worker."""
import re

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_user_launches_a_run_and_sees_it_finish_with_a_plotted_curve(live_server, worker, user, tiny_target, page):
    page.goto(live_server.url + "/")
    expect(page).to_have_url(f"{live_server.url}/login/?next=/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")
    page.click("text=Launch a run")

    page.fill("#id_target_path", str(tiny_target.target_dir))
    page.dispatch_event("#id_target_path", "change")
    # The form asks the server for the target's config and prefills EAGLE-3's default layers.
    expect(page.locator("#id_layer_ids")).to_have_value("2, 4, 5, 8")
    expect(page.locator("#target-info")).to_contain_text("8 layers")
    page.fill("#id_dataset_path", str(tiny_target.chats_path))
    page.fill("#id_max_samples", "30")
    page.fill("#id_max_seq_len", "256")
    page.fill("#id_draft_vocab_size", "256")
    page.fill("#id_epochs", "1")
    page.fill("#id_ttt_steps", "2")
    page.click("#launch-submit")

    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=600_000)
    for stage in ("prepare", "extract", "vocab", "train", "evaluate"):
        expect(page.locator(f'tr[data-stage="{stage}"] [data-field="status"]')).to_have_text("succeeded")
    expect(page.locator("#plot-loss .main-svg").first).to_be_visible(timeout=20_000)
    traces = page.evaluate("document.getElementById('plot-loss').data.length")
    assert traces >= 2  # a train curve per TTT step at least
    expect(page.locator("#checkpoints")).to_contain_text("vllm serve")
    # Acceptance measured by speculative decoding: tau, its per-position bars, and the greedy check.
    expect(page.locator("#plot-acceptance .main-svg").first).to_be_visible(timeout=20_000)
    tau = float(page.locator('[data-acc="tau"]').inner_text())
    assert 1.0 <= tau <= 3.0
    expect(page.locator('[data-acc="output_matches_greedy"]')).to_have_text("yes (token for token)")
