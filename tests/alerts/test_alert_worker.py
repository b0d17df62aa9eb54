"""Through a real Celery worker on the cpu queue: a failed run's alert is posted to a real local webhook
receiver that answers 500 the first time (the worker tries again after its wait) and mailed by the
worker's mail backend (the console's, so its log holds the message)."""
from __future__ import annotations

import time

import pytest

from runs.alerts import services
from runs.alerts.models import AlertDelivery
from runs.alerts.services import RuleInput
from runs.pipeline.lifecycle.stage_services import stage_fail
from tests.helpers.worker import celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _settled(timeout: float) -> list[tuple]:
    deadline = time.monotonic() + timeout
    while True:
        rows = sorted(AlertDelivery.objects.values_list("channel", "status", "attempts", "last_error"))
        if rows and all(status != "pending" for _, status, _, _ in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_a_worker_delivers_and_retries_after_a_500(user, run, receiver, data_root, tmp_path):
    services.rule_create(user=user, data=RuleInput(event="run_failed", webhook_url=receiver.url, email=True))
    receiver.fail_next = 1
    log_path = tmp_path / "worker.log"
    env = {"EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "EAGLE3WEB_ALERT_RETRY_SECONDS": "1",
           "DJANGO_EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend"}
    with celery_worker(data_root=data_root, log_path=log_path, queues="cpu", extra_env=env, name="alerts"):
        stage_fail(stage_name="prepare", record_id=run.preparation.pk, error="OSError: disk full", log_tail="")
        rows = _settled(timeout=60)
        log = log_path.read_text()
    assert rows == [("email", "sent", 1, ""), ("webhook", "sent", 2, "")], log[-3000:]
    text = f"run {run.pk} “alerted run” failed at prepare dataset: OSError: disk full\n/runs/{run.pk}/"
    assert [(r["status"], r["body"]) for r in receiver.requests] == [(500, {"text": text}), (200, {"text": text})]
    assert "To: launcher@example.com" in log
    assert "failed at prepare dataset: OSError: disk full" in log
    assert "eagle3web.alert_delivery" in log
