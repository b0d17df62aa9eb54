"""/api/v1/alert-rules/: a user's alert rules, listed, made and deleted. Thin: parse, call the service
(runs.alerts.services.rule_create, as the rules page does), answer; a bad value is a 400 naming its field."""
from __future__ import annotations

from rest_framework import serializers
from rest_framework.response import Response

from runs.alerts import selectors, services
from runs.alerts.models import Event
from runs.api.base import ApiInputError, ApiView, created, error_response


class AlertRuleSerializer(serializers.Serializer):
    event = serializers.CharField(help_text=f"one of {', '.join(Event.values)}")
    webhook_url = serializers.CharField(required=False, allow_blank=True, default="",
                                        help_text="POST {\"text\": ...} there (Slack-compatible); its host must be "
                                                  "in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS")
    email = serializers.BooleanField(required=False, default=False, help_text="mail each recipient with an address")
    threshold = serializers.FloatField(required=False, allow_null=True, default=None,
                                       help_text="tau_below: fire when the run's τ is below this")
    baseline_run = serializers.IntegerField(required=False, allow_null=True, default=None,
                                            help_text="tau_below: fire when the run's τ is below this run's")
    stall_minutes = serializers.IntegerField(required=False, allow_null=True, default=None,
                                             help_text="stage_stalled: minutes without progress")
    team = serializers.CharField(required=False, allow_null=True, allow_blank=True, default=None,
                                 help_text="null: your runs, heard by you; \"staff\" or a team (group) name: every "
                                           "member's runs, heard by every member")


def rule_shape(rule) -> dict:
    return {"id": rule.pk, "event": rule.event, "team": "staff" if rule.staff else (rule.team.name if rule.team else None),
            "email": rule.email, "webhook_url": rule.webhook_url, "threshold": rule.threshold,
            "baseline_run": rule.baseline_run_id, "stall_minutes": rule.stall_minutes,
            "created_at": rule.created_at.isoformat()}


class AlertRuleList(ApiView):
    request_serializers = {"POST": AlertRuleSerializer}
    responses = {"GET": {"200": "{results: [your alert rules]}"},
                 "POST": {"201": "the rule made: {id, event, team, email, webhook_url, threshold, baseline_run, "
                                 "stall_minutes, created_at}"}}

    def get(self, request):
        """Your alert rules, newest first."""
        return Response({"results": [rule_shape(rule) for rule in selectors.rule_list(user=request.user)]})

    def post(self, request):
        """Make an alert rule; refused (400, naming the field) for a bad value, nothing stored."""
        body = self.body()
        try:
            rule = services.rule_create(user=request.user, data=services.RuleInput(**body),
                                       site_url=services.request_site_url(request))
        except services.RuleError as exc:
            raise ApiInputError(str(exc), field=exc.field) from None
        return created(rule_shape(rule))


class AlertRuleDetail(ApiView):
    responses = {"DELETE": {"204": "deleted, with the alerts it fired", "404": "no rule of yours with this id"}}

    def delete(self, request, pk: int):
        """Delete one of your alert rules."""
        if not services.rule_delete(user=request.user, rule_id=pk):
            return error_response(f"no alert rule {pk} of yours", code=404)
        return Response(status=204)


def notice_shape(notice) -> dict:
    alert = notice.alert
    return {"id": notice.pk, "event": alert.event, "subject": alert.subject, "text": alert.text,
            "run": alert.run_id, "created_at": alert.created_at.isoformat(),
            "read_at": notice.read_at.isoformat() if notice.read_at else None,
            "deliveries": [{"channel": d.channel, "status": d.status, "attempts": d.attempts}
                           for d in alert.deliveries.all()]}


class MarkReadSerializer(serializers.Serializer):
    id = serializers.IntegerField(required=False, allow_null=True, default=None,
                                  help_text="one of your alerts (its `id` in GET alerts/); null or absent: all of them")


class AlertList(ApiView):
    """What the bell shows, for scripts: your alerts, newest first, and how many are unread."""

    responses = {"GET": {"200": "{unread, results: [{id, event, subject, text, run, created_at, read_at, deliveries}]}"}}

    def get(self, request):
        """Your alerts (the newest the bell shows) and the unread count."""
        return Response({"unread": selectors.unread_count(user=request.user),
                         "results": [notice_shape(n) for n in selectors.notice_list(user=request.user)]})


class AlertRead(ApiView):
    request_serializers = {"POST": MarkReadSerializer}
    responses = {"POST": {"200": "{marked: how many were unread, unread: what is left}",
                          "404": "no alert of yours with this id"}}

    def post(self, request):
        """Mark one of your alerts read, or all of them."""
        notice_id = self.body()["id"]
        marked = services.notices_mark_read(user=request.user, notice_id=notice_id)
        if notice_id is not None and not marked and not selectors.notice_exists(user=request.user,
                                                                                notice_id=notice_id):
            return error_response(f"no alert {notice_id} of yours", code=404)
        return Response({"marked": marked, "unread": selectors.unread_count(user=request.user)})
