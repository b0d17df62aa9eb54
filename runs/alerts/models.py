"""Alerts: the rules a user sets (which event, whose runs, where to hear it), each firing of a rule for
one subject (a run, a stage attempt), the bell's notices per recipient, and each delivery by email or
webhook with its attempts.

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Event(models.TextChoices):
    RUN_FAILED = "run_failed", "a run failed"
    STAGE_STALLED = "stage_stalled", "a stage made no progress for N minutes"
    TAU_BELOW = "tau_below", "τ below a threshold or a baseline run's"
    LOSS_NAN = "loss_nan", "a loss became NaN or infinite"
    WORKER_LOST = "worker_lost", "a stage's worker was lost"


class AlertRule(models.Model):
    """Whose runs a rule watches and who hears it: its owner's runs, heard by its owner; with a team (a
    group that is not a role) or `staff`, the runs of every member, heard by every member."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_rules")
    event = models.CharField(max_length=20, choices=Event.choices)
    team = models.ForeignKey("auth.Group", on_delete=models.CASCADE, null=True, blank=True, related_name="alert_rules")
    staff = models.BooleanField(default=False, help_text="the team is every staff user")
    email = models.BooleanField(default=False, help_text="mail each recipient that has an address")
    webhook_url = models.URLField(max_length=1000, blank=True, help_text="Slack-compatible: POST {\"text\": ...}")
    threshold = models.FloatField(null=True, blank=True, help_text="tau_below: fire when τ is below this")
    baseline_run = models.ForeignKey("runs.PipelineRun", on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+", help_text="tau_below: fire when τ is below this run's")
    stall_minutes = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="stage_stalled: minutes without progress")
    # Alerts fire in workers, where no request names the site: their links start with EAGLE3WEB_SITE_URL, or,
    # where it is unset, with the scheme and host of the request that made the rule.
    site_url = models.CharField(max_length=300, blank=True,
                                help_text="scheme://host of the request that made the rule (its links' start when "
                                          "EAGLE3WEB_SITE_URL is unset)")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.event} rule {self.pk} of {self.owner}"

    def link(self, path: str) -> str:
        """An absolute link to `path` for this rule's messages (relative only where neither is known)."""
        return f"{settings.EAGLE3WEB_SITE_URL or self.site_url}{path}"


class Alert(models.Model):
    """One firing: a rule fires once per subject ("run 12", "train 40 attempt 2"), so a condition the
    reconciler sees on every tick alerts once."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    subject = models.CharField(max_length=200)
    event = models.CharField(max_length=20, choices=Event.choices)
    run = models.ForeignKey("runs.PipelineRun", on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "subject"], name="alert_once_per_rule_subject")]


class AlertNotice(models.Model):
    """The alert in one recipient's bell; read once they marked it."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notices")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_notices")
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-alert__created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["alert", "user"], name="alert_notice_once_per_user")]
        indexes = [models.Index(fields=["user", "read_at"], name="alert_notice_unread")]


class AlertDelivery(models.Model):
    """One message of an alert to one address (an email) or URL (a webhook), sent by the workers' cpu queue
    and tried again with a doubling wait until it is sent or MAX_ATTEMPTS failed (runs.alerts.services)."""

    class Channel(models.TextChoices):
        EMAIL = "email", "email"
        WEBHOOK = "webhook", "webhook"

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        SENT = "sent", "sent"
        FAILED = "failed", "failed (gave up)"
        REFUSED = "refused", "refused (not an allowed destination)"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    destination = models.CharField(max_length=1000)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True, help_text="pending: not tried again before this")
    handed_at = models.DateTimeField(null=True, blank=True, help_text="when its message was due to run: a pending "
                                     "delivery long past it lost its message and is sent again")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class StageWatch(models.Model):
    """The progress the reconciler last saw of a running stage, and since when it has not moved: a stage
    row keeps no time of its last progress (its heartbeat renews the lease whether it moves or not)."""

    stage = models.CharField(max_length=20)
    record_id = models.BigIntegerField()
    started_at = models.DateTimeField(help_text="which attempt of the stage")
    progress_done = models.BigIntegerField(default=0)
    unchanged_since = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stage", "record_id"], name="stage_watch_once")]
