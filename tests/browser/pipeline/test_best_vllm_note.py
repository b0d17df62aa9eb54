"""The run page in headless Chromium while a serve check of the run's best lands: the best stays the
one our τ chose, vLLM's figure appears beside ours in the best's sentence, and the note that the two
disagree beyond the prompts' noise appears without a reload (static/js/runs/loss_tau.js, from the polled
summary). The run is tests/services/checkpoints/test_best_by_tau.py's: epoch 3 best by our τ (2.41, standard error
0.04 over 4 prompts), which vLLM serves at 2.20."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from runs.models import ServeCheck
from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.helpers.fleet import fake_gpu_worker
from tests.services.checkpoints.test_best_by_tau import NOTE, _evaluated, _launch, _served, _trained

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_vllms_disagreement_with_the_best_appears_live_and_the_best_stays(live_server, user, roots, page):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=1)  # FAKE: a vLLM host, so the run may ask for a check
    run = _launch(user, roots, serve_check=True)
    _evaluated(run, _trained(run))
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    best = "best by τ: epoch 3 (τ 2.41); lowest validation loss: epoch 2 (τ 2.30)."
    expect(page.locator("#best-choice")).to_have_text(best)
    expect(page.locator("#best-vllm-note")).to_be_hidden()
    _served(ServeCheck.objects.get(), vllm_tau=2.20)
    expect(page.locator("#best-vllm-note")).to_have_text(NOTE, timeout=20_000)
    expect(page.locator("#best-vllm-note")).to_be_visible()
    expect(page.locator("#best-choice")).to_have_text(best.replace("(τ 2.41)", "(τ 2.41; vLLM 2.20)"))
    expect(page.locator("#checkpoint-table tr.best td").first).to_have_text(re.compile(r"^\s*3\s+best\s*$"))
    watch.clean()
