"""In Chromium: the bell in the nav counts a user's unread alerts on every page; it opens the list, where
alerts are marked read one at a time or all at once, and the count follows."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.alerts import events, services
from runs.alerts.services import RuleInput
from runs.models import StageStatus
from runs.pipeline.lifecycle.stage_services import stage_fail

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_bell_counts_unread_alerts_and_the_list_marks_them_read(live_server, page, user, run):
    services.rule_create(user=user, data=RuleInput(event="run_failed"))
    services.rule_create(user=user, data=RuleInput(event="loss_nan"))
    events.metrics_recorded(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": "loss_0", "step": 7, "epoch": 0.0, "value": float("nan")}])
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="<img src=x> broke", log_tail="")
    assert type(run.preparation).objects.get(pk=run.preparation.pk).status == StageStatus.FAILED

    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")
    expect(page.locator("#alert-unread")).to_have_text("2")  # on the runs list, in the nav
    page.click("#alert-bell")
    expect(page.locator("h1")).to_have_text("Alerts")
    rows = page.locator("#alert-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator(".alert-text")).to_contain_text(
        f"run {run.pk} “alerted run” failed at prepare dataset: <img src=x> broke")  # shown as text
    expect(rows.nth(1).locator(".alert-text")).to_contain_text("train loss_0 is nan at step 7")
    expect(page.locator("#alert-table img")).to_have_count(0)
    expect(page.locator("#alert-table tr.unread")).to_have_count(2)

    rows.nth(0).locator("text=Mark read").click()
    expect(page.locator("#alert-unread")).to_have_text("1")
    expect(page.locator("#alert-table tr.unread")).to_have_count(1)
    expect(page.locator("#alert-table tr.read")).to_contain_text("failed at prepare dataset")
    page.click("#alerts-read-all")
    expect(page.locator("#alert-unread")).to_have_count(0)
    expect(page.locator("#alert-table tr.read")).to_have_count(2)
    expect(page.locator(".message")).to_have_text("Marked 1 alert read.")

    # An alert fired while the page stays open reaches the bell without a reload (its poll of /api/v1/alerts/,
    # asked now by the page becoming visible instead of waiting out the minute).
    services.rule_create(user=user, data=RuleInput(event="loss_nan"))
    events.metrics_recorded(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": "loss_1", "step": 8, "epoch": 0.0, "value": float("inf")}])
    page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    expect(page.locator("#alert-unread")).to_have_text("1")
    expect(page.locator("#alert-bell")).to_have_attribute("title", "Alerts: 1 unread")
