"""The run page's "Hidden-state supply" box in headless Chromium, for an online run whose training recorded
its supply through the service (runs.pipeline.lifecycle.result_records.training_record): the figures and the
bottleneck as text, the supply/* curves charted as their own group beside the loss, "keep the cache"
asked from the page and refused in words while the cache lacks rows, and the box redrawn by the page's
polls when the keep's state changes. No error in the console."""
from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.models import Preparation, StageStatus
from runs.pipeline.online import services as online_services
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.services import metrics_record
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.views.pipeline.test_online_supply import URLS, record_training, supply_report

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_supply_box_shows_the_bottleneck_and_asks_to_keep_the_cache(live_server, user, roots, page, tmp_path):
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64, hidden_states="online", capture_servers=0,
                                               capture_urls=URLS))
    Preparation.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, num_rows=3)
    record_training(run, tmp_path, supply_report())
    training_id = run.training_run.pk
    metrics_record(training_run_id=training_id, points=[
        {"split": "train", "key": key, "step": step, "epoch": 0, "value": value, "time": timezone.now().timestamp()}
        for step in (1, 2, 3) for key, value in (("loss_0", 3.0 - step / 10),
                                                 ("supply/fetch_wait_fraction", 0.5 - step / 10))])
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")

    box = page.locator("#supply")
    expect(box.locator("h2")).to_have_text("Hidden-state supply")
    expect(box.locator('[data-supply="bound"] td')).to_have_text("supply-bound: the trainer waited for hidden states")
    expect(box.locator('[data-supply="fetch_wait_fraction"] td')).to_have_text("37.5 % of step time (4.5 s)")
    expect(box.locator('[data-supply="served_by"] td')).to_have_text(
        "http://10.0.0.7:8000: 5 · http://10.0.0.8:8000: 4")
    expect(page.locator("#supply-advice")).to_have_text("2 capture servers feed 1 trainer at this size")
    # supply/* charts as its own group, titled, with the values recorded.
    page.wait_for_function("(() => { const d = document.getElementById('plot-supply/fetch_wait_fraction');"
                           " return d && d.data && d.data[0].y.length === 3; })()", timeout=20_000)
    assert [round(v, 3) for v in page.evaluate(
        "document.getElementById('plot-supply/fetch_wait_fraction').data[0].y")] == [0.4, 0.3, 0.2]
    assert page.evaluate("document.getElementById('plot-supply/fetch_wait_fraction').layout.title.text") == (
        "Supply: share of step time waiting for data")

    # The cache folder holds no row: asked from the page, refused in words, nothing stored.
    page.click("#keep-cache")
    expect(page.locator("#supply-keep .field-error")).to_have_text(
        "the cache holds 0 of 3 prepared rows: 3 missing (evicted to stay under 20.0 GiB, or never asked for); only "
        "a cache that holds every row can be kept")
    # A keep that failed on its worker reaches the page through its polls.
    online_services.online_keep_fail(run_id=run.pk, error="CacheIncomplete: 1 missing")
    expect(page.locator("#supply-keep")).to_have_text("Keeping the cache: failed: CacheIncomplete: 1 missing",
                                                      timeout=15_000)
    # The refusal's 400 is the one error the browser logs (its own "Failed to load resource" line).
    assert [e for e in errors if "status of 400" not in e] == [], errors


def test_the_launch_form_offers_online_when_the_extraction_would_not_fit(live_server, user, roots, page):
    from tests.browser.launch.test_launch_form import fill_valid, log_in

    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    fill_valid(page, roots)
    page.locator("#id_target_path").dispatch_event("change")
    expect(page.locator("#target-info")).to_contain_text("EAGLE-3 default layers: 2, 4, 5, 8")
    page.fill("#id_max_seq_len", "512")
    page.fill("#id_max_samples", "10")  # 10 x 512 tokens x 4 layers x 128 B: 2.6 MB, which fits
    expect(page.locator("#online-offer")).to_be_hidden()
    page.fill("#id_max_samples", "2000000000")  # 2e9 x 512 x 4 x 128 B: 524 TB, which does not
    offer = page.locator("#online-offer")
    expect(offer).to_contain_text("An offline extraction of up to 524.3 TB (2000000000 rows x 512 tokens x 4 layers)")
    page.click("#switch-online")
    expect(page.locator("#id_hidden_states")).to_have_value("online")
    expect(page.locator("#advanced")).to_have_attribute("open", "")
    expect(offer).to_be_hidden()
    # No live worker takes vLLM's queue here: the capture server the default asks for is refused on its field.
    page.fill("#id_max_samples", "10")
    page.click("#launch-submit")
    expect(page.locator('.field[data-field="capture_servers"] .field-error')).to_contain_text(
        "capture_servers 1: the train stage starts vLLM capture servers and goes to queue vllm.1, which no live "
        "worker takes")
