"""τ while training (issue 39), with two real Celery workers on the tests' PostgreSQL and Redis: one trains,
the other measures each checkpoint from the queue as it is saved.

The draft is frozen: lr 1e-12 moves no float32 weight (an Adam step is about lr, far under a weight's
last bit), so every checkpoint decodes the same τ, and stop_when_tau_flat=1 must stop the training once
two checkpoints are measured, long before its 60 epochs."""
from __future__ import annotations

import time

import pytest
from django.test import Client

from runs.models import StageStatus, TrainingRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.worker import celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EPOCHS = 60


def test_a_checkpoints_tau_shows_while_training_runs_and_flat_tau_stops_training(tiny_target, data_root, tmp_path,
                                                                                   user):
    page = Client()
    page.force_login(user)
    seen_while_training = None
    with celery_worker(data_root=data_root, log_path=tmp_path / "trainer.log", name="trainer"), \
            celery_worker(data_root=data_root, log_path=tmp_path / "evaluator.log", name="evaluator", queues="gpu",
                          purge=False):
        # Launched once both workers listen: the first worker's start purges its queues, messages included.
        run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                                  config=RunConfig(max_samples=40, max_seq_len=256, draft_vocab_size=256, epochs=EPOCHS,
                                                   lr=1e-12, ttt_steps=2, eval_prompts=2, eval_max_new_tokens=8,
                                                   stop_when_tau_flat=1))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            training = TrainingRun.objects.get(run=run)
            summary = page.get(f"/api/v1/runs/{run.pk}/").json()
            if training.status == StageStatus.RUNNING and seen_while_training is None:
                measured = [c for c in summary["checkpoints"] if c["tau"] is not None]
                if measured:
                    seen_while_training = measured[0]
            if training.status in (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED):
                break
            time.sleep(0.5)
        training = TrainingRun.objects.get(run=run)
        services.run_cancel(run=run, user=user)  # the evaluate stage would measure every unmeasured checkpoint
    log = (tmp_path / "trainer.log").read_text()[-3000:] + (tmp_path / "evaluator.log").read_text()[-3000:]
    assert training.status == StageStatus.SUCCEEDED, (training.status, training.error, log)
    # The API showed a checkpoint's τ while the training stage was still running.
    assert seen_while_training is not None, log
    assert 1.0 <= seen_while_training["tau"] <= 3.0
    # Stopped early, saying why, with the checkpoints it had saved.
    epochs_saved = training.checkpoints.count()
    assert 2 <= epochs_saved < EPOCHS, epochs_saved
    assert training.stopped_early.startswith("stopped early: τ stopped rising (stop_when_tau_flat=1)"), training.stopped_early
    rows = [(c.epoch, e.tau, e.worker) for c in training.checkpoints.all()
            for e in c.evaluations.filter(status=StageStatus.SUCCEEDED)]
    assert len(rows) >= 2 and len({tau for _, tau, _ in rows}) == 1, rows  # frozen: the same τ each
    # Measured by the other worker while this one trained.
    assert training.worker and all(worker != training.worker for _, _, worker in rows), (training.worker, rows)
    # The run says why it stopped, beside its training stage.
    summary = page.get(f"/api/v1/runs/{run.pk}/").json()
    assert summary["training"]["stopped_early"] == training.stopped_early
    train = next(s for s in summary["stages"] if s["name"] == "train")
    assert training.stopped_early in train.get("warnings", []), train
