"""The checkpoint page's generations table in headless Chromium, under the Content-Security-Policy
(static/js/runs/generations.js): each token coloured by the draft position that proposed it, one outlined span
per verification forward, the prompts filtered by length and τ, and another checkpoint's reply to the same
prompt beside each one. Epoch 0 was measured with the oracle stand-in (every draft accepted), epoch 1 with
the one right at position 1 only (tests/helpers/generations.py), on the same three prompts, EOS off."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.helpers.generations import FULL_CHAINS, MAX_NEW, measured, record
from tests.services.checkpoints.test_best_by_tau import _launch, _trained

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def oracle(tiny_target):
    return measured(tiny_target, "oracle", eos=set())


@pytest.fixture(scope="module")
def first_only(tiny_target):
    return measured(tiny_target, "first", eos=set())


def _background(page, selector: str) -> str:
    return page.eval_on_selector(selector, "node => getComputedStyle(node).backgroundColor")


def test_tokens_are_coloured_by_position_filtered_and_compared(live_server, user, roots, page, oracle, first_only):
    run = _launch(user, roots)
    trained = _trained(run)
    record(stage=run.evaluation, checkpoint=trained[0], found=oracle)
    record(stage=run.evaluation, checkpoint=trained[1], found=first_only)
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/checkpoints/{trained[0].pk}/")
    section = page.locator("#generations")
    expect(section).to_have_attribute("data-rendered", "drawn")
    table = page.locator("#generations-table")
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(3)

    # Per reply: k drafted tokens a forward at positions 1..3, the bonus token after them, the prefill's first.
    first_row = rows.nth(0)
    for position in (1, 2, 3):
        expect(first_row.locator(f".tok.pos-{position}")).to_have_count(FULL_CHAINS)
    expect(first_row.locator(".tok.bonus")).to_have_count(FULL_CHAINS)
    expect(first_row.locator(".tok.prefill")).to_have_count(1)
    expect(first_row.locator(".tok")).to_have_count(MAX_NEW)
    expect(first_row.locator(".step")).to_have_count(1 + FULL_CHAINS)  # the prefill, then each forward
    expect(first_row.locator(".tok.corrected")).to_have_count(0)
    colours = {name: _background(page, f"#generations-table tbody tr:first-child .tok.{name}")
               for name in ("pos-1", "pos-2", "pos-3", "bonus")}
    assert len(set(colours.values())) == 4, colours
    token = first_row.locator(".tok.pos-2").first
    token.hover()  # a token's title is made on hover
    expect(token).to_have_attribute("title", re.compile(r"^draft position 2, accepted · verification 1 · id \d+$"))
    expect(page.locator("#generations-legend .tok.pos-3")).to_have_count(1)

    # Filters: by prompt length (the rows of at least the middle length stay), by τ (4 each), and a bad bound.
    lengths = sorted(len(p) for p in oracle.prompts)
    page.fill("#gen-min-tokens", str(lengths[1]))
    expect(table.locator("tbody tr:not([hidden])")).to_have_count(sum(n >= lengths[1] for n in lengths))
    page.fill("#gen-min-tokens", "")
    page.fill("#gen-min-tau", "4.5")
    expect(table.locator("tbody tr:not([hidden])")).to_have_count(0)
    expect(page.locator("#generations-status")).to_contain_text("0 of 3 prompts shown")
    page.fill("#gen-min-tau", "4")
    expect(table.locator("tbody tr:not([hidden])")).to_have_count(3)
    page.fill("#gen-max-tau", "fast")
    expect(page.locator("#generations-filter-error")).to_contain_text("τ to")
    page.fill("#gen-max-tau", "")
    expect(page.locator("#generations-filter-error")).to_have_text("")

    # Side by side: epoch 1's reply to the same prompt, one accepted draft and one correction a forward.
    page.select_option("#generations-compare", str(trained[1].pk))
    expect(section).to_have_attribute("data-rendered", "compared")
    beside = rows.nth(0).locator(f'td.reply-cell[data-checkpoint="{trained[1].pk}"]')
    forwards = (MAX_NEW - 1) // 2
    expect(beside.locator(".tok.pos-1")).to_have_count(forwards)
    expect(beside.locator(".tok.corrected")).to_have_count(forwards)
    expect(beside.locator("del.rejected")).to_have_count(forwards)
    correction = beside.locator(".tok.corrected").first
    correction.hover()
    expect(correction).to_have_attribute("title", re.compile(r"^the target's correction: .* at position 2, rejected"))
    expect(beside.locator(".tok.pos-2")).to_have_count(0)
    expect(beside).to_contain_text("τ 2.00")
    expect(table.locator("thead th").nth(5)).to_contain_text(f"#{trained[1].pk} epoch 2 of {run}")  # from 1
    # The same reply text on both sides: the draft changes the speed, never the text.
    left = rows.nth(0).locator("td.reply-cell").nth(0).locator(".tok").all_text_contents()
    assert beside.locator(".tok").all_text_contents() == left
    watch.clean()
