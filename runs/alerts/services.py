"""Writes of alerts: making and deleting rules, firing a rule for a subject (its notices and deliveries),
marking notices read, and sending a delivery (the workers' cpu queue, tried again with a doubling wait).

A delivery's message is sent after the transaction that made it commits; a message lost on the way (a
broker away, a worker killed while it waited to retry or while it sent) is sent again by the workers'
reconcilers (deliveries_flush). Two messages for one delivery send it once: the first claims the attempt
(delivery_send), the second finds it not due."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from eagle3web.celery import celery_app
from runs.alerts import selectors
from runs.alerts.models import Alert, AlertDelivery, AlertNotice, AlertRule, Event
from runs.alerts.webhooks import WebhookRefused, webhook_check, webhook_post
from runs.pipeline.models import PipelineRun
from runs.projects import access
from runs.roles import ROLES

logger = logging.getLogger(__name__)

DELIVERY_TASK = "eagle3web.alert_delivery"  # workers.orchestration.tasks.alert_delivery_task
# Deliveries are short network calls: the cpu queue, which every fleet (the demo's, compose's) consumes.
DELIVERY_QUEUE = "cpu"
MAX_ATTEMPTS = 6  # with the default 30 s first wait: given up after about 15 minutes
MAX_WAIT = timedelta(hours=1)
# A pending delivery whose message should have run this long ago is sent again by the reconcilers.
LOST_AFTER = timedelta(seconds=30)
# How long an attempt being sent is its sender's: past the mail and webhook timeouts (10 s each).
SENDING_CLAIM = timedelta(seconds=60)
MAX_STALL_MINUTES = 7 * 24 * 60
MAX_TAU = 1000.0


class RuleError(ValueError):
    def __init__(self, message: str, *, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RuleInput:
    event: str
    webhook_url: str = ""
    email: bool = False
    threshold: float | None = None
    baseline_run: int | None = None
    stall_minutes: int | None = None
    team: str | None = None  # None or "": the owner's runs; "staff"; or a team's (group's) name


def _team(user, name: str | None) -> tuple[Group | None, bool]:
    if not name:
        return None, False
    if name == "staff":
        if not user.is_staff:
            raise RuleError("only staff users may set a rule for all staff", field="team")
        return None, True
    group = user.groups.exclude(name__in=ROLES).filter(name=name).first()
    if group is None:
        raise RuleError(f"{name[:100]!r} is not a team of yours (your teams: "
                        f"{', '.join(v for v, _ in selectors.user_teams(user=user)) or 'none'})", field="team")
    return group, False


def _event_settings(data: RuleInput, user) -> dict:
    """The settings of the rule's event, each refused where another event's or out of range."""
    if data.event not in Event.values:
        raise RuleError(f"event must be one of {', '.join(Event.values)}, not {str(data.event)[:40]!r}", field="event")
    for name, event in (("threshold", Event.TAU_BELOW), ("baseline_run", Event.TAU_BELOW),
                        ("stall_minutes", Event.STAGE_STALLED)):
        if getattr(data, name) is not None and data.event != event:
            raise RuleError(f"{name} applies to {event} rules only, not {data.event}", field=name)
    values = {}
    if data.event == Event.TAU_BELOW:
        if data.threshold is None and data.baseline_run is None:
            raise RuleError("a tau_below rule needs a threshold, a baseline run, or both", field="threshold")
        if data.threshold is not None:
            if not (math.isfinite(data.threshold) and 0 < data.threshold <= MAX_TAU):
                raise RuleError(f"threshold must be a number above 0 and at most {MAX_TAU:g} (τ counts tokens "
                                "per target forward, 1 and up)", field="threshold")
            values["threshold"] = float(data.threshold)
        if data.baseline_run is not None:
            # A run the user does not see is answered as one that does not exist (runs.projects.access).
            runs = access.visible("run", PipelineRun.objects.all(), user)
            baseline = runs.filter(pk=data.baseline_run).first() if 0 < data.baseline_run < 2**63 else None
            if baseline is None:
                raise RuleError(f"no run {data.baseline_run} to compare with", field="baseline_run")
            values["baseline_run"] = baseline
    if data.event == Event.STAGE_STALLED:
        if data.stall_minutes is None or not 1 <= data.stall_minutes <= MAX_STALL_MINUTES:
            raise RuleError(f"stall_minutes must be a whole number of minutes from 1 to {MAX_STALL_MINUTES}",
                            field="stall_minutes")
        values["stall_minutes"] = data.stall_minutes
    return values


def rule_create(*, user, data: RuleInput, site_url: str = "") -> AlertRule:
    """A rule of `user`; RuleError naming the field for a bad value, and nothing stored. `site_url`: the
    scheme and host of the request that makes it (`request_site_url`), its links' start where
    EAGLE3WEB_SITE_URL is unset."""
    values = _event_settings(data, user)
    team, staff = _team(user, data.team)
    url = (data.webhook_url or "").strip()
    if url:
        if len(url) > 1000:
            raise RuleError("webhook_url is longer than 1000 characters", field="webhook_url")
        try:
            webhook_check(url)
        except WebhookRefused as exc:
            raise RuleError(str(exc), field="webhook_url") from None
    return AlertRule.objects.create(owner=user, event=data.event, team=team, staff=staff, email=bool(data.email),
                                    webhook_url=url, site_url=site_url[:300], **values)


def request_site_url(request) -> str:
    """scheme://host[:port] of a request, as Django validated its host (ALLOWED_HOSTS)."""
    return request.build_absolute_uri("/").rstrip("/")


def rule_delete(*, user, rule_id: int) -> bool:
    """Delete the user's rule (an admin: anyone's) with its alerts; False when there is none of theirs."""
    rule = selectors.rule_of_user(user=user, rule_id=rule_id)
    if rule is None:
        return False
    rule.delete()
    return True


def alert_fire(*, rule: AlertRule, subject: str, text: str, run_id: int | None = None) -> Alert | None:
    """Fire `rule` for `subject` unless it fired for it before: a notice in each recipient's bell, and a
    delivery per address and webhook, handed to the workers once the caller commits. None if it had."""
    with transaction.atomic():
        alert, created = Alert.objects.get_or_create(rule=rule, subject=subject[:200],
                                                     defaults={"event": rule.event, "run_id": run_id, "text": text})
        if not created:
            return None
        recipients = selectors.rule_recipients(rule=rule)
        if run_id is not None:  # those who do not see the run's project hear nothing of it
            project_id = PipelineRun.objects.filter(pk=run_id).values_list("project_id", flat=True).first()
            seeing = set(access.who_sees(get_user_model().objects.filter(pk__in=[u.pk for u in recipients]),
                                         project_id=project_id).values_list("pk", flat=True))
            recipients = [user for user in recipients if user.pk in seeing]
        AlertNotice.objects.bulk_create([AlertNotice(alert=alert, user=user) for user in recipients])
        now = timezone.now()
        destinations = [(AlertDelivery.Channel.EMAIL, u.email) for u in recipients if rule.email and u.email]
        if rule.webhook_url:
            destinations.append((AlertDelivery.Channel.WEBHOOK, rule.webhook_url))
        deliveries = AlertDelivery.objects.bulk_create([
            AlertDelivery(alert=alert, channel=channel, destination=destination, handed_at=now)
            for channel, destination in destinations])
        for delivery in deliveries:
            _hand_over(delivery.pk)
    logger.info("alert %s: %s", alert.pk, text)
    return alert


def _hand_over(delivery_id: int, *, countdown: float | None = None) -> None:
    transaction.on_commit(lambda: _send_message(delivery_id, countdown=countdown), robust=True)


def _send_message(delivery_id: int, *, countdown: float | None = None) -> None:
    try:
        celery_app.send_task(DELIVERY_TASK, args=[delivery_id], queue=DELIVERY_QUEUE, countdown=countdown)
    except Exception:  # noqa: BLE001 - the row stays pending: a reconciler's deliveries_flush sends it later
        logger.warning("could not hand alert delivery %s to the broker; a worker's reconciler will", delivery_id,
                       exc_info=True)


def retry_wait(attempts: int) -> timedelta:
    """How long after its `attempts`-th failure a delivery is tried again: doubling from the setting."""
    return min(MAX_WAIT, timedelta(seconds=settings.EAGLE3WEB_ALERT_RETRY_SECONDS * 2 ** max(0, attempts - 1)))


def _deliver(delivery: AlertDelivery) -> None:
    alert = delivery.alert
    if delivery.channel == AlertDelivery.Channel.EMAIL:
        first_line = alert.text.splitlines()[0] if alert.text else alert.event
        send_mail(f"[eagle3web] {first_line[:150]}", alert.text, None, [delivery.destination], fail_silently=False)
    else:
        webhook_post(delivery.destination, alert.text)


def delivery_send(*, delivery_id: int) -> str:
    """Send a pending delivery that is due; what became of it ("sent", "retry", "failed", "refused", or why
    nothing was done: "not pending", "not due").

    The attempt is claimed in one short transaction (counted, and not due again for SENDING_CLAIM, so a
    second message for it does nothing meanwhile), sent outside any transaction (a slow mail server or
    webhook holds no lock: on SQLite a transaction holds the whole database's), then recorded."""
    now = timezone.now()
    with transaction.atomic():
        delivery = AlertDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None or delivery.status != AlertDelivery.Status.PENDING:
            return "not pending"
        if delivery.next_attempt_at and delivery.next_attempt_at > now + timedelta(seconds=1):
            return "not due"
        # Were this worker to die while sending, the reconcilers send it again once the claim has passed.
        claim = now + SENDING_CLAIM
        attempts = delivery.attempts + 1
        AlertDelivery.objects.filter(pk=delivery.pk).update(attempts=attempts, next_attempt_at=claim, handed_at=claim,
                                                            updated_at=now)
    delivery = AlertDelivery.objects.select_related("alert").get(pk=delivery_id)
    fields = {"attempts": attempts, "next_attempt_at": None, "updated_at": timezone.now()}
    try:
        _deliver(delivery)
    except WebhookRefused as exc:
        fields.update(status=AlertDelivery.Status.REFUSED, last_error=str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure of the mail server or webhook is recorded and retried
        fields["last_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        if attempts >= MAX_ATTEMPTS:
            fields["status"] = AlertDelivery.Status.FAILED
        else:
            wait = retry_wait(attempts)
            fields["next_attempt_at"] = fields["handed_at"] = timezone.now() + wait
    else:
        fields.update(status=AlertDelivery.Status.SENT, sent_at=timezone.now(), last_error="")
    with transaction.atomic():
        AlertDelivery.objects.filter(pk=delivery_id).update(**fields)
        if "handed_at" in fields:
            _hand_over(delivery_id, countdown=(fields["next_attempt_at"] - timezone.now()).total_seconds())
    status = fields.get("status", AlertDelivery.Status.PENDING)
    if status != AlertDelivery.Status.SENT:
        logger.warning("alert delivery %s (%s to %s), attempt %d: %s", delivery_id, delivery.channel,
                       delivery.destination, attempts, fields["last_error"])
    return {AlertDelivery.Status.SENT: "sent", AlertDelivery.Status.PENDING: "retry"}.get(status, status)


def deliveries_flush() -> int:
    """Send again the pending deliveries whose message should have run by now (lost on the way); how many."""
    now = timezone.now()
    lost = AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING, handed_at__lt=now - LOST_AFTER)
    count = 0
    for pk in list(lost.values_list("pk", flat=True)[:100]):
        with transaction.atomic():
            # Claimed for LOST_AFTER: another reconciler's tick meanwhile leaves it alone.
            if AlertDelivery.objects.filter(pk=pk, status=AlertDelivery.Status.PENDING,
                                            handed_at__lt=now - LOST_AFTER).update(handed_at=now):
                _hand_over(pk)
                count += 1
    return count


def notices_mark_read(*, user, notice_id: int | None = None) -> int:
    """Mark one of the user's notices read (None: all of them); how many were unread."""
    notices = AlertNotice.objects.filter(user=user, read_at__isnull=True)
    if notice_id is not None:
        notices = notices.filter(pk=notice_id)
    return notices.update(read_at=timezone.now())
