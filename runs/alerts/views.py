"""The alerts pages: the list behind the bell (marking read) and the rules page (create, delete). Thin:
a selector or a service, then render."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from runs.alerts import selectors, services
from runs.alerts.forms import AlertRuleForm


def alert_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/alerts/alert_list.html", {"notices": selectors.notice_list(user=request.user)})


@require_POST
def alert_read(request: HttpRequest) -> HttpResponse:
    """Mark one notice read (`notice` in the form), or all of them."""
    text = request.POST.get("notice", "")
    notice_id = int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None
    if text and notice_id is None:
        messages.error(request, f"notice must be a notice's id, not {text[:20]!r}")
        return redirect("runs:alert_list")
    count = services.notices_mark_read(user=request.user, notice_id=notice_id)
    messages.info(request, f"Marked {count} alert{'s' if count != 1 else ''} read.")
    return redirect("runs:alert_list")


def alert_rules(request: HttpRequest) -> HttpResponse:
    teams = selectors.user_teams(user=request.user)
    form = AlertRuleForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        try:
            rule = services.rule_create(user=request.user, data=form.rule_input(),
                                       site_url=services.request_site_url(request))
        except services.RuleError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        else:
            messages.success(request, f"Alert rule {rule.pk} ({rule.event}) made.")
            return redirect("runs:alert_rules")
    return render(request, "runs/alerts/alert_rules.html", {"form": form, "rules": selectors.rule_list(user=request.user)},
                  status=400 if form.errors else 200)


@require_POST
def alert_rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    if services.rule_delete(user=request.user, rule_id=pk):
        messages.info(request, f"Alert rule {pk} deleted.")
    else:
        messages.error(request, f"No alert rule {pk} of yours to delete.")
    return redirect("runs:alert_rules")
