"""Alerts in the admin (runs/admin.py imports this). A rule is made on the alerts page or by the API
(runs.alerts.services.rule_create checks its settings and its webhook's destination), never here: staff
read rules and delete one that should not fire; the rest (firings, bell notices, deliveries, the stall
watch) is written by the reconciler and the workers: read-only, off the index."""
from django.contrib import admin

from runs.admin_bases import InternalAdmin, NoAddAdmin
from runs.alerts.models import Alert, AlertDelivery, AlertNotice, AlertRule, StageWatch


@admin.register(AlertRule)
class AlertRuleAdmin(NoAddAdmin):
    list_display = ("id", "owner", "event", "team", "staff", "email", "webhook_url", "threshold", "stall_minutes",
                    "created_at")
    list_filter = ("event", "staff", "email")
    list_select_related = ("owner", "team")
    search_fields = ("owner__username", "webhook_url")

    def has_change_permission(self, request, obj=None):
        return False  # an edited webhook URL would skip the destination check; delete and make it again


@admin.register(Alert)
class AlertAdmin(InternalAdmin):
    list_display = ("id", "rule", "event", "subject", "run", "created_at")
    list_filter = ("event",)
    list_select_related = ("rule__owner", "run")
    search_fields = ("subject", "text")


@admin.register(AlertNotice)
class AlertNoticeAdmin(InternalAdmin):
    list_display = ("id", "alert", "user", "read_at")
    list_select_related = ("alert", "user")


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(InternalAdmin):
    list_display = ("id", "alert", "channel", "destination", "status", "attempts", "next_attempt_at", "sent_at")
    list_filter = ("channel", "status")
    list_select_related = ("alert",)
    search_fields = ("destination", "last_error")


@admin.register(StageWatch)
class StageWatchAdmin(InternalAdmin):
    list_display = ("id", "stage", "record_id", "progress_done", "unchanged_since")
    list_filter = ("stage",)
