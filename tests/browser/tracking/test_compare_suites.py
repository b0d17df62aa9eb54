"""Compare's runs × suites table in headless Chromium: two runs measured on the held-out prompts and on the
suite "code" (the checkpoints of tests/services/checkpoints/test_eval_suites.py), one choosing its best by
held_out, the other by code; each row shows its best's τ on each suite, the suite that chose it in bold, with no
console error."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in
from tests.services.checkpoints.test_best_by_tau import _launch, _trained
from tests.services.checkpoints.test_eval_suites import CHAT, CODE, _evaluated

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_compare_page_shows_runs_by_suites(live_server, user, roots, page):
    code = roots / "code.jsonl"
    code.write_text(CHAT)
    by_held_out = _launch(user, roots, eval_suites={"code": str(code)})
    _evaluated(by_held_out, _trained(by_held_out), {"code": CODE})
    by_code = _launch(user, roots, eval_suites={"code": str(code)}, best_suite="code")
    _evaluated(by_code, _trained(by_code), {"code": CODE})
    watch = Watch(page)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/compare/?ids={by_held_out.pk},{by_code.pk}")
    table = page.locator("#suites-table")
    expect(table.locator("thead th[data-suite]")).to_have_text(["held_out", "code"])
    first, second = (table.locator(f'tr[data-run="{run.pk}"]') for run in (by_held_out, by_code))
    # By held_out: epoch 3 (2.41 held out, 1.90 on code); by code: epoch 1 (2.00 held out, 2.60 on code).
    expect(first.locator("td.suite-tau")).to_have_text(["2.41", "1.90"])
    expect(first.locator('td[data-suite="held_out"] strong')).to_have_text("2.41")
    expect(first.locator("th")).to_contain_text("epoch 3")
    expect(second.locator("td.suite-tau")).to_have_text(["2.00", "2.60"])
    expect(second.locator('td[data-suite="code"] strong')).to_have_text("2.60")
    expect(second.locator("th")).to_contain_text("epoch 1")
    watch.clean()
