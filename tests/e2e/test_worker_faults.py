"""Faults a long run meets, against real Celery workers, PostgreSQL and Redis."""
import time

import pytest
from django.db.models import Count

from runs import services
from runs.models import MetricPoint, StageAttempt, StageStatus, TrainingRun
from runs.run_config import RunConfig
from tests.worker import celery_worker, kill_worker_hard, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT_LEASE = {"EAGLE3WEB_STAGE_LEASE_SECONDS": "3"}


def wait_until(predicate, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_a_worker_killed_during_training_is_replaced_and_the_run_finishes(tiny_target, data_root, tmp_path, user):
    with celery_worker(data_root=data_root, log_path=tmp_path / "first.log", extra_env=SHORT_LEASE) as first:
        # Launched once the worker is up: starting a test worker purges the queues.
        run = services.run_launch(
            user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
            config=RunConfig(max_samples=40, max_seq_len=256, draft_vocab_size=256, epochs=25, ttt_steps=2),
        )
        training = TrainingRun.objects.filter(run=run)
        wait_until(lambda: training.filter(status=StageStatus.RUNNING, progress_done__gte=3).exists(), timeout=300,
                   what="training to be under way")
        kill_worker_hard(first)
    assert training.get().status == StageStatus.RUNNING  # nobody is left to say otherwise
    with celery_worker(data_root=data_root, log_path=tmp_path / "second.log", extra_env=SHORT_LEASE):
        summary = wait_for_run(run.pk, timeout=600, log_path=tmp_path / "second.log")
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    attempts = list(StageAttempt.objects.filter(run=run, stage="train").order_by("number"))
    assert [a.outcome for a in attempts] == ["failed", "succeeded"]
    assert "stopped renewing its lease" in attempts[0].error and "queued again" in attempts[0].error
    duplicates = (MetricPoint.objects.filter(training_run__run=run).values("split", "key", "step")
                  .annotate(n=Count("id")).filter(n__gt=1))
    assert not duplicates.exists()
    assert summary["acceptance"]["output_matches_greedy"] is True
