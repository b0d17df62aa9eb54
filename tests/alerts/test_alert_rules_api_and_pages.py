"""Rules through the API (`/api/v1/alert-rules/`) and the rules page: made, listed, deleted; a bad value is a
400 naming the field and stores nothing; the list page behind the bell marks alerts read."""
from __future__ import annotations

import json

import pytest

from runs.alerts import services
from runs.alerts.models import AlertNotice, AlertRule
from runs.alerts.services import RuleInput
from runs.pipeline.lifecycle.stage_services import stage_fail
from tests.api.conftest import ApiClient, make_user
from runs.api import tokens

pytestmark = pytest.mark.django_db
URL = "/api/v1/alert-rules/"


@pytest.fixture
def api(user):
    return ApiClient(tokens.token_create(user=user, name="alerts")[1])


def test_a_rule_made_listed_and_deleted_through_the_api(api, user, receiver):
    made = api.post(URL, {"event": "run_failed", "webhook_url": receiver.url, "email": True})
    assert made.status_code == 201, made.content
    body = made.json()
    assert {k: body[k] for k in ("event", "team", "email", "webhook_url", "threshold", "baseline_run",
                                  "stall_minutes")} == {
        "event": "run_failed", "team": None, "email": True, "webhook_url": receiver.url, "threshold": None,
        "baseline_run": None, "stall_minutes": None}
    stalled = api.post(URL, {"event": "stage_stalled", "stall_minutes": 20})
    assert stalled.status_code == 201 and stalled.json()["stall_minutes"] == 20
    listed = api.get(URL).json()["results"]
    assert [(r["id"], r["event"]) for r in listed] == [(stalled.json()["id"], "stage_stalled"),
                                                        (body["id"], "run_failed")]

    other = ApiClient(tokens.token_create(user=make_user("someone-else", "launcher"), name="x")[1])
    assert other.get(URL).json()["results"] == []
    refused = other.call("DELETE", f"{URL}{body['id']}/")
    assert refused.status_code == 404 and refused.json()["error"] == f"no alert rule {body['id']} of yours"
    assert api.call("DELETE", f"{URL}{body['id']}/").status_code == 204
    assert list(AlertRule.objects.values_list("event", flat=True)) == ["stage_stalled"]


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"event": "run_exploded"}, "event", "event must be one of run_failed, stage_stalled, tau_below, loss_nan, "
                                         "worker_lost, not 'run_exploded'"),
    ({"event": "tau_below"}, "threshold", "a tau_below rule needs a threshold, a baseline run, or both"),
    ({"event": "tau_below", "threshold": -1}, "threshold", "threshold must be a number above 0"),
    ({"event": "tau_below", "baseline_run": 99999999}, "baseline_run", "no run 99999999 to compare with"),
    ({"event": "stage_stalled"}, "stall_minutes", "stall_minutes must be a whole number of minutes from 1 to 10080"),
    ({"event": "stage_stalled", "stall_minutes": 0}, "stall_minutes", "stall_minutes must be a whole number"),
    ({"event": "run_failed", "stall_minutes": 5}, "stall_minutes", "stall_minutes applies to stage_stalled rules only"),
    ({"event": "run_failed", "webhook_url": "http://169.254.169.254/latest"}, "webhook_url",
     "webhook host '169.254.169.254' is not in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS"),
    ({"event": "run_failed", "team": "launcher"}, "team", "'launcher' is not a team of yours"),
    ({"event": "run_failed", "stall_minute": 5}, "stall_minute", "unknown field 'stall_minute'"),
    ({"event": "loss_nan", "threshold": "low"}, "threshold", "A valid number is required."),
])
def test_bad_values_are_refused_naming_the_field(api, body, field, words):
    response = api.post(URL, body)
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == [field]
    assert words in response.json()["fields"][field]
    assert not AlertRule.objects.exists()


def test_the_api_needs_a_login(client):
    assert client.get(URL).status_code == 401
    assert client.get("/alerts/").status_code == 302 and client.get("/alerts/rules/").status_code == 302


def test_the_rules_page_makes_deletes_and_names_the_bad_field(client, user, receiver):
    client.login(username="launcher", password="pw-launcher-1")
    bad = client.post("/alerts/rules/", {"event": "tau_below", "threshold": ""})
    assert bad.status_code == 400
    assert b"a tau_below rule needs a threshold, a baseline run, or both" in bad.content
    assert b'<p data-field="threshold">' in bad.content and not AlertRule.objects.exists()
    refused = client.post("/alerts/rules/", {"event": "run_failed", "webhook_url": "http://localhost:1/"})
    assert refused.status_code == 400 and b"is not in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS" in refused.content

    made = client.post("/alerts/rules/", {"event": "run_failed", "webhook_url": receiver.url, "email": "on"})
    assert made.status_code == 302
    rule = AlertRule.objects.get()
    assert (rule.event, rule.email, rule.webhook_url, rule.team) == ("run_failed", True, receiver.url, None)
    page = client.get("/alerts/rules/")
    assert f'data-rule="{rule.pk}"'.encode() in page.content and receiver.url.encode() in page.content
    client.post(f"/alerts/rules/{rule.pk}/delete/")
    assert not AlertRule.objects.exists()


def test_the_list_page_shows_alerts_and_marks_them_read(client, user, run):
    services.rule_create(user=user, data=RuleInput(event="run_failed"))
    services.rule_create(user=user, data=RuleInput(event="worker_lost"))
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="<b>boom</b>", log_tail="")
    client.login(username="launcher", password="pw-launcher-1")
    page = client.get("/alerts/")
    assert page.status_code == 200
    assert b'<span class="badge" id="alert-unread">1</span>' in page.content
    assert b"failed at prepare dataset: &lt;b&gt;boom&lt;/b&gt;" in page.content  # text, never markup
    notice = AlertNotice.objects.get()
    assert client.post("/alerts/read/", {"notice": "x1"}).status_code == 302
    assert AlertNotice.objects.get().read_at is None
    client.post("/alerts/read/", {"notice": str(notice.pk)})
    assert AlertNotice.objects.get().read_at is not None
    assert b'id="alert-unread"' not in client.get("/alerts/").content


def _fail_prepare(run) -> None:
    from runs.pipeline.lifecycle.stage_services import stage_start

    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="w1")
    stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="ValueError: no rows left", log_tail="")


@pytest.mark.parametrize("made_by", ["page", "api"])
def test_without_a_site_url_the_webhooks_link_starts_with_the_host_that_made_the_rule(
        made_by, client, api, user, run, receiver, settings):
    """EAGLE3WEB_SITE_URL unset: the link the webhook receives is absolute, from the scheme and host of the
    request that made the rule (the alert fires in a worker, where no request is)."""
    from runs.alerts.models import Alert, AlertDelivery

    settings.EAGLE3WEB_SITE_URL = ""
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "eagle.lab.example"]
    if made_by == "page":
        client.login(username="launcher", password="pw-launcher-1")
        made = client.post("/alerts/rules/", {"event": "run_failed", "webhook_url": receiver.url},
                           HTTP_HOST="eagle.lab.example:8443")
        assert made.status_code == 302
    else:
        made = api.client.post(URL, json.dumps({"event": "run_failed", "webhook_url": receiver.url}),
                               content_type="application/json", HTTP_HOST="eagle.lab.example:8443", **api._extra())
        assert made.status_code == 201, made.content
    _fail_prepare(run)
    for delivery in AlertDelivery.objects.all():
        services.delivery_send(delivery_id=delivery.pk)
    link = f"http://eagle.lab.example:8443/runs/{run.pk}/"
    assert Alert.objects.get().text.endswith("\n" + link)
    assert [body["text"].splitlines()[-1] for body in receiver.bodies()] == [link]


def test_a_set_site_url_goes_before_the_host_that_made_the_rule(client, user, run, settings):
    from runs.alerts.models import Alert

    settings.EAGLE3WEB_SITE_URL = "https://eagle3web.example.org"
    client.login(username="launcher", password="pw-launcher-1")
    assert client.post("/alerts/rules/", {"event": "run_failed"}).status_code == 302
    _fail_prepare(run)
    assert Alert.objects.get().text.endswith(f"\nhttps://eagle3web.example.org/runs/{run.pk}/")
