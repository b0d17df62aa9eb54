"""Alerts fired where runs need someone, delivered to a real local webhook receiver and Django's locmem mail,
once per rule and subject, retried after a 500, refused for a host that is not allowed."""
from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from runs.alerts import events, services
from runs.alerts.models import Alert, AlertDelivery, AlertNotice
from runs.alerts.services import RuleError, RuleInput
from runs.models import StageStatus
from runs.pipeline.lifecycle.stage_services import stage_fail, stage_start, stages_reconcile
from runs.tracking.services import metrics_record

pytestmark = pytest.mark.django_db


def _send_all() -> list[str]:
    return [services.delivery_send(delivery_id=pk) for pk in AlertDelivery.objects.order_by("pk").values_list("pk", flat=True)]


def test_a_failed_run_reaches_the_bell_the_mailbox_and_the_webhook_once(user, run, receiver):
    services.rule_create(user=user, data=RuleInput(event="run_failed", email=True, webhook_url=receiver.url))
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="w1")
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="ValueError: no rows left\n\ntraceback",
               log_tail="")

    alert = Alert.objects.get()
    assert alert.subject == f"run {run.pk}" and alert.run_id == run.pk
    assert list(AlertNotice.objects.values_list("user__username", "read_at")) == [("launcher", None)]
    assert sorted(AlertDelivery.objects.values_list("channel", "destination", "status")) == [
        ("email", "launcher@example.com", "pending"), ("webhook", receiver.url, "pending")]

    assert _send_all() == ["sent", "sent"]
    expected = f"run {run.pk} “alerted run” failed at prepare dataset: ValueError: no rows left\n/runs/{run.pk}/"
    assert receiver.bodies() == [{"text": expected}]
    assert receiver.requests[0]["path"] == "/hooks/team"
    assert receiver.requests[0]["content_type"] == "application/json"
    assert [(m.to, m.subject, m.body) for m in mail.outbox] == [
        (["launcher@example.com"], f"[eagle3web] run {run.pk} “alerted run” failed at prepare dataset: ValueError: "
                                   "no rows left", expected)]
    assert set(AlertDelivery.objects.values_list("status", "attempts")) == {("sent", 1)}
    # Sent deliveries are not sent again, and the same failure recorded again alerts no one again.
    assert _send_all() == ["not pending", "not pending"]
    assert events.run_failed(run_id=run.pk, stage_name="prepare", error="again") == 0
    assert Alert.objects.count() == 1 and len(receiver.requests) == 1


def test_a_cancelled_stage_alerts_no_one(user, run, receiver):
    services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url=receiver.url))
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="cancelled", log_tail="", cancelled=True)
    assert not Alert.objects.exists()


def test_a_webhook_that_answered_500_is_tried_again_after_its_wait(user, run, receiver, settings):
    settings.EAGLE3WEB_ALERT_RETRY_SECONDS = 30
    services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url=receiver.url))
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="boom", log_tail="")
    receiver.fail_next = 1
    before = timezone.now()
    assert _send_all() == ["retry"]
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error == "WebhookFailed: the webhook answered HTTP 500: receiver down for a moment"
    assert timedelta(seconds=29) < delivery.next_attempt_at - before < timedelta(seconds=32)
    assert _send_all() == ["not due"]  # a second message before its time sends nothing
    AlertDelivery.objects.update(next_attempt_at=timezone.now())
    assert _send_all() == ["sent"]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("sent", 2, "")
    assert [r["status"] for r in receiver.requests] == [500, 200]


def test_the_wait_doubles_and_a_delivery_gives_up(user, run, settings):
    settings.EAGLE3WEB_ALERT_RETRY_SECONDS = 30
    assert [services.retry_wait(n).total_seconds() for n in (1, 2, 3, 8)] == [30, 60, 120, 3600]
    settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    # Nothing listens on port 9 of this machine: every attempt fails to connect.
    services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url="http://127.0.0.1:9/"))
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="boom", log_tail="")
    for _ in range(services.MAX_ATTEMPTS):
        AlertDelivery.objects.update(next_attempt_at=None)
        _send_all()
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", services.MAX_ATTEMPTS)
    assert delivery.last_error.startswith("ConnectionRefusedError")


def test_webhooks_to_hosts_not_allowed_are_refused_naming_why(user, run, receiver, settings):
    settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com", "localhost"]
    with pytest.raises(RuleError) as refused:
        services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url="http://10.1.2.3/hook"))
    assert refused.value.field == "webhook_url"
    assert str(refused.value) == ("webhook host '10.1.2.3' is not in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS (allowed: "
                                  "hooks.example.com, localhost)")
    # A listed name that resolves to loopback is refused unless the address is listed too.
    with pytest.raises(RuleError) as refused:
        services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url="http://localhost:8/x"))
    assert "resolves to 127.0.0.1, a loopback, private or link-local address; list 127.0.0.1 in " \
           "EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS to allow it" in str(refused.value)
    with pytest.raises(RuleError, match="must start with http:// or https://"):
        services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url="file:///etc/passwd"))
    assert not services.selectors.rule_list(user=user).exists()
    # Listed: the address (or a network holding it) beside the name.
    settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = ["localhost", "127.0.0.1", "10.0.0.0/8"]
    for url in ("http://localhost:8/x", "http://10.1.2.3/hook"):
        assert services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url=url)).webhook_url == url
    services.selectors.rule_list(user=user).delete()

    # Allowed when the rule was made, not any more when it fires: refused at sending, nothing posted.
    settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url=receiver.url))
    settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="boom", log_tail="")
    assert _send_all() == ["refused"]
    delivery = AlertDelivery.objects.get()
    assert delivery.last_error.startswith("webhook host '127.0.0.1' is not in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS")
    assert receiver.requests == []


def test_a_nan_loss_alerts_once_per_run(user, run):
    services.rule_create(user=user, data=RuleInput(event="loss_nan"))
    training = run.training_run.pk
    metrics_record(training_run_id=training, points=[{"split": "train", "key": "loss_0", "step": 1, "epoch": 0.0,
                                                       "value": 2.5}])
    assert not Alert.objects.exists()
    metrics_record(training_run_id=training, points=[
        {"split": "train", "key": "full_acc_0", "step": 2, "epoch": 0.0, "value": math.nan},  # not a loss
        {"split": "train", "key": "loss_1", "step": 2, "epoch": 0.0, "value": math.nan}])
    metrics_record(training_run_id=training, points=[{"split": "val", "key": "loss_0", "step": 3, "epoch": 0.0,
                                                       "value": math.inf}])
    assert list(Alert.objects.values_list("event", "text")) == [
        ("loss_nan", f"run {run.pk} “alerted run”: train loss_1 is nan at step 2\n/runs/{run.pk}/")]


def test_tau_below_a_threshold_or_a_baseline_runs(user, run, roots):
    from runs.pipeline import services as run_services
    from runs.pipeline.launch.run_config import RunConfig

    baseline = run_services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                       config=RunConfig(), name="baseline", enqueue=False)
    type(baseline.training_run).objects.filter(pk=baseline.training_run.pk).update(best_tau=2.25)
    type(run.training_run).objects.filter(pk=run.training_run.pk).update(best_tau=1.75)
    low = services.rule_create(user=user, data=RuleInput(event="tau_below", threshold=1.5))
    high = services.rule_create(user=user, data=RuleInput(event="tau_below", threshold=1.8))
    against = services.rule_create(user=user, data=RuleInput(event="tau_below", baseline_run=baseline.pk))
    assert events.tau_recorded(run_id=run.pk) == 2
    assert dict(Alert.objects.values_list("rule_id", "text")) == {
        high.pk: f"run {run.pk} “alerted run”: τ 1.750 is below the threshold 1.8\n/runs/{run.pk}/",
        against.pk: f"run {run.pk} “alerted run”: τ 1.750 is below baseline run {baseline.pk} “baseline”'s τ 2.250"
                    f"\n/runs/{run.pk}/"}
    assert not Alert.objects.filter(rule=low).exists()
    assert events.tau_recorded(run_id=baseline.pk) == 0  # 2.25: above 1.8, and the baseline itself
    assert events.tau_recorded(run_id=run.pk) == 0  # once per run


def test_a_lost_worker_alerts_once_per_lost_attempt(user, run):
    services.rule_create(user=user, data=RuleInput(event="worker_lost"))
    record = run.preparation
    stage_start(stage_name="prepare", record_id=record.pk, worker="cpu-1@gone")
    type(record).objects.filter(pk=record.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    stages_reconcile()
    stages_reconcile()  # queued again now: nothing lapsed, nothing new
    assert list(Alert.objects.values_list("subject", "text")) == [
        (f"prepare {record.pk} attempt 1",
         f"run {run.pk} “alerted run”: worker cpu-1@gone was lost during prepare dataset (attempt 1)\n/runs/{run.pk}/")]


def test_a_stalled_stage_alerts_once_per_stall(user, run):
    services.rule_create(user=user, data=RuleInput(event="stage_stalled", stall_minutes=5))
    from runs.alerts.models import StageWatch
    from runs.pipeline.lifecycle.stage_services import stage_progress

    record = run.preparation
    stage_start(stage_name="prepare", record_id=record.pk, worker="w")
    stage_progress(stage_name="prepare", record_id=record.pk, done=3, total=10, log_tail="")
    assert events.stages_stalled_check() == 0  # first seen now
    StageWatch.objects.update(unchanged_since=timezone.now() - timedelta(minutes=4))
    assert events.stages_stalled_check() == 0  # 4 minutes: under the rule's 5
    StageWatch.objects.update(unchanged_since=timezone.now() - timedelta(minutes=6))
    assert events.stages_stalled_check() == 1
    assert events.stages_stalled_check() == 0  # every later tick of the same stall: nothing new
    assert Alert.objects.get().text.startswith(f"run {run.pk} “alerted run”: prepare dataset has made no progress since ")
    assert "(6 min, stuck at 3)" in Alert.objects.get().text
    # Progress moves: the watch starts over, and a later stall would alert again.
    stage_progress(stage_name="prepare", record_id=record.pk, done=4, total=10, log_tail="")
    assert events.stages_stalled_check() == 0
    assert StageWatch.objects.get().progress_done == 4
    stage_fail(stage_name="prepare", record_id=record.pk, error="x", log_tail="")
    events.stages_stalled_check()
    assert not StageWatch.objects.exists()  # no longer running: forgotten


def test_a_team_rule_watches_every_members_runs_and_every_member_hears_it(user, run, django_user_model):
    from django.contrib.auth.models import Group

    team = Group.objects.create(name="draft-team")
    lead = django_user_model.objects.create_user("lead", email="lead@example.com")
    outsider = django_user_model.objects.create_user("outsider")
    for member in (user, lead):
        member.groups.add(team)
    with pytest.raises(RuleError, match="'draft-team' is not a team of yours") as refused:
        services.rule_create(user=outsider, data=RuleInput(event="run_failed", team="draft-team"))
    assert refused.value.field == "team"
    with pytest.raises(RuleError, match="only staff users"):
        services.rule_create(user=lead, data=RuleInput(event="run_failed", team="staff"))
    services.rule_create(user=lead, data=RuleInput(event="run_failed", team="draft-team", email=True))
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="boom", log_tail="")
    assert sorted(AlertNotice.objects.values_list("user__username", flat=True)) == ["launcher", "lead"]
    assert sorted(AlertDelivery.objects.values_list("destination", flat=True)) == [
        "launcher@example.com", "lead@example.com"]
    assert StageStatus.FAILED == type(run.preparation).objects.get(pk=run.preparation.pk).status


def test_a_run_trained_elsewhere_that_ends_failed_alerts_once(user):
    from runs.pipeline.launch.external import external_run_create, external_run_end

    services.rule_create(user=user, data=RuleInput(event="run_failed"))
    run = external_run_create(user=user, name="cluster job", config={"lr": 3e-4})
    external_run_end(run=run, user=user, status="failed", message="NCCL timeout\ntraceback")
    alert = Alert.objects.get()
    assert alert.run_id == run.pk
    assert alert.text == f"run {run.pk} “cluster job” failed at train draft: NCCL timeout\n/runs/{run.pk}/"
    assert list(AlertNotice.objects.values_list("user__username", flat=True)) == [user.username]


def test_alert_links_carry_the_sites_address_when_it_is_set(user, run, settings):
    settings.EAGLE3WEB_SITE_URL = "https://eagle3web.example.org"
    services.rule_create(user=user, data=RuleInput(event="run_failed"))
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="w1")
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="ValueError: no rows left", log_tail="")
    assert Alert.objects.get().text.endswith(f"\nhttps://eagle3web.example.org/runs/{run.pk}/")


def test_a_script_reads_its_alerts_and_marks_them_read_through_the_api(user, run, client):
    services.rule_create(user=user, data=RuleInput(event="run_failed"))
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="w1")
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="ValueError: no rows left", log_tail="")
    client.force_login(user)
    listed = client.get("/api/v1/alerts/").json()
    assert listed["unread"] == 1 and [(a["event"], a["run"], a["read_at"]) for a in listed["results"]] == [
        ("run_failed", run.pk, None)]
    assert listed["results"][0]["text"].startswith(f"run {run.pk} “alerted run” failed at prepare dataset")
    missing = client.post("/api/v1/alerts/read/", {"id": 2**40}, content_type="application/json")
    assert missing.status_code == 404 and client.get("/api/v1/alerts/").json()["unread"] == 1
    one = listed["results"][0]["id"]
    assert client.post("/api/v1/alerts/read/", {"id": one}, content_type="application/json").json() == {
        "marked": 1, "unread": 0}
    assert client.get("/api/v1/alerts/").json()["results"][0]["read_at"] is not None
    assert client.post("/api/v1/alerts/read/", {}, content_type="application/json").json() == {"marked": 0, "unread": 0}
    client.logout()
    assert client.get("/api/v1/alerts/").status_code == 401
