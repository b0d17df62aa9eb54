"""The rules page's form: it types the fields; every rule about their values is the service's
(runs.alerts.services.rule_create), which the API calls too, so both refuse the same things."""
from __future__ import annotations

from django import forms

from runs.alerts.models import Event
from runs.alerts.services import RuleInput


class AlertRuleForm(forms.Form):
    event = forms.ChoiceField(choices=Event.choices)
    team = forms.ChoiceField(required=False, help_text="whose runs: yours, or every member's (each member hears it)")
    email = forms.BooleanField(required=False, label="Email", help_text="mail each recipient that has an address")
    webhook_url = forms.CharField(required=False, max_length=1000, label="Webhook URL",
                                  help_text="Slack-compatible; its host must be in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS")
    threshold = forms.FloatField(required=False, help_text="tau_below: fire when the run's τ is below this")
    baseline_run = forms.IntegerField(required=False, label="Baseline run id",
                                      help_text="tau_below: fire when the run's τ is below this run's")
    stall_minutes = forms.IntegerField(required=False, help_text="stage_stalled: minutes without progress")

    def __init__(self, *args, teams: list[tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [("", "my runs"), *teams]

    def rule_input(self) -> RuleInput:
        data = self.cleaned_data
        return RuleInput(event=data["event"], webhook_url=data["webhook_url"], email=data["email"],
                         threshold=data["threshold"], baseline_run=data["baseline_run"],
                         stall_minutes=data["stall_minutes"], team=data["team"] or None)
