"""A run whose training runs, as a worker marks it, for the tests of what its live pages cost and answer
(tests/views/pipeline, tests/views/tracking): launched through the service, its training marked running with a
lease, its points written through the workers' own write path."""
from __future__ import annotations

from django.test import Client
from django.utils import timezone

from runs.models import StageStatus, TrainingRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.services import metrics_record

# What the demo's training writes each step (bench/load/load_rows.py): 12 curves.
DEMO_KEYS = ("loss", "loss_0", "loss_1", "loss_2", "full_acc_0", "full_acc_1", "full_acc_2",
             "cond_acc_0", "cond_acc_1", "cond_acc_2", "lr", "tokens_per_s")


def demo_points(steps) -> list[dict]:
    """The demo's 12 curves at these steps."""
    return [{"split": "train", "key": key, "step": s, "epoch": s / 250, "value": 1.0 / (1 + s) + i}
            for s in steps for i, key in enumerate(DEMO_KEYS)]


def training_run(user, roots, points: list[dict] = ()):
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(), enqueue=False)
    now = timezone.now()
    TrainingRun.objects.filter(run=run).update(status=StageStatus.RUNNING, started_at=now, worker="w",
                                               lease_expires_at=now + timezone.timedelta(hours=1))
    if points:
        metrics_record(training_run_id=run.training_run.pk, points=list(points))
    return run


def signed_in(user) -> Client:
    """A browser of its own, signed in as `user` (its password in `raw_password`, as tests/conftest.py's users)."""
    client = Client()
    assert client.login(username=user.username, password=user.raw_password)
    return client
