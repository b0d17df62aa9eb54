"""A generations block with replies measured for real (tests/helpers/generations.py: the tiny target decoding its
chat prompts with the oracle stand-in, every draft accepted, k = 3, EOS off): the page's script draws the
first `prompts` replies from the generations API, and the export carries them, each drafted token in
the class of the draft position that proposed it."""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from runs.reports import services
from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.helpers.generations import FULL_CHAINS, MAX_NEW, measured, record
from tests.services.checkpoints.test_best_by_tau import _launch, _trained


@pytest.fixture(scope="module")
def oracle(tiny_target):
    return measured(tiny_target, "oracle", eos=set())


def _measured_checkpoint(user, roots, oracle):
    run = _launch(user, roots)
    checkpoint = _trained(run)[0]
    record(stage=run.evaluation, checkpoint=checkpoint, found=oracle)
    return checkpoint


@pytest.mark.django_db
def test_the_export_holds_the_first_replies_token_by_token(client, user, roots, oracle):
    checkpoint = _measured_checkpoint(user, roots, oracle)
    report = services.report_create(user=user, title="g", body=f"{{{{generations checkpoint={checkpoint.pk} prompts=2}}}}")
    client.force_login(user)
    html = client.get(f"/reports/{report.pk}/export/").content.decode()
    replies = re.findall(r'<div class="reply">(.*?)</div>', html, flags=re.S)
    assert len(replies) == 2  # of the three measured
    for reply in replies:
        kinds = re.findall(r'<span class="tok ([a-z0-9-]+)">', reply)
        # The prefill's token, then per forward the three drafted tokens and the target's bonus token.
        assert kinds == ["prefill"] + ["pos-1", "pos-2", "pos-3", "bonus"] * FULL_CHAINS
        assert len(kinds) == MAX_NEW
    data = json.loads(html.split('<script id="report-data" type="application/json">')[1].split("</script>")[0])
    block = data["blocks"][0]
    assert block["data"]["prompts_total"] == 3 and len(block["data"]["prompts"]) == 2
    assert [p["index"] for p in block["data"]["prompts"]] == [0, 1]
    assert "2 of 3 prompts of #" in html


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_page_draws_the_replies_from_the_generations_api(live_server, user, roots, oracle, page):
    checkpoint = _measured_checkpoint(user, roots, oracle)
    report = services.report_create(user=user, title="g", body=f"{{{{generations checkpoint={checkpoint.pk} prompts=1}}}}")
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/reports/{report.pk}/")
    section = page.locator(".report-generations")
    expect(section).to_have_attribute("data-state", "shown", timeout=20_000)
    expect(section.locator(".report-generation")).to_have_count(1)
    tokens = section.locator(".reply .tok")
    expect(tokens).to_have_count(MAX_NEW)
    assert section.locator(".reply .tok.pos-1").count() == FULL_CHAINS
    assert section.locator(".reply .tok.bonus").count() == FULL_CHAINS
    # One outlined span per verification forward, the prefill's included.
    assert section.locator(".reply .step").count() == FULL_CHAINS + 1
    watch.clean()
