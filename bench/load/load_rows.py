"""The rows bench/load/load.py and bench/load/request_costs.py measure against: finished runs with logs, attempts,
curves, checkpoints and an approval, the people who sign in, and a writer that appends metric points as
a training worker does (imported by them; Django is set up by then)."""
from __future__ import annotations

import threading
from pathlib import Path

PASSWORD = "bench-load-password-1"
FLUSH_SECONDS = 2.0  # workers.stages.train.loop.METRICS_FLUSH_SECONDS

def _points(steps: range, epoch_steps: int) -> list[dict]:
    keys = ["loss", "loss_0", "loss_1", "loss_2", "full_acc_0", "full_acc_1", "full_acc_2",
            "cond_acc_0", "cond_acc_1", "cond_acc_2", "lr", "tokens_per_s"]
    return [{"step": s, "epoch": s / epoch_steps, "split": "train", "key": k, "value": 1.0 / (1 + s) + i}
            for s in steps for i, k in enumerate(keys)]


def _finish(run, *, statuses: dict[str, str], log: str) -> None:
    """Stage rows and attempts as a worker leaves them (plain ORM: the gates a worker passes, such as
    a verified extraction before training, are not what this benchmark measures)."""
    from django.utils import timezone

    from runs.models import StageAttempt
    from runs.pipeline.lifecycle.stages import STAGES

    now = timezone.now()
    for stage in STAGES:
        status = statuses.get(stage.name, "succeeded")
        if status == "queued":
            continue
        finished = None if status == "running" else now
        stage.model.objects.filter(run=run).update(status=status, started_at=now, finished_at=finished,
                                                   log_tail=log, worker="bench@host", progress_done=100,
                                                   progress_total=100)
        record_id = stage.model.objects.values_list("pk", flat=True).get(run=run)
        StageAttempt.objects.create(run=run, stage=stage.name, record_id=record_id, number=1, worker="bench@host",
                                    started_at=now, finished_at=finished, outcome=status, log_tail=log)


def seed(*, runs: int, target_dir: Path, chats: Path) -> tuple[object, object]:
    """The user and `runs` runs, all but the last finished; returns (user, the last one, still queued)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from runs.pipeline.lifecycle import result_records
    from runs.pipeline import services
    from runs.review import reviews
    from runs.tracking import services as metric_services
    from runs.pipeline.launch.run_config import RunConfig

    user = get_user_model().objects.create_user("bench", password=PASSWORD, is_superuser=True)
    user.groups.add(Group.objects.get_or_create(name="launcher")[0])
    log = "\n".join(f"step {i}: loss 1.{i:04d}, {i * 37} tokens/s" for i in range(60))  # a 2 kB log tail
    launched = [services.run_launch(user=user, target_path=target_dir, dataset_path=chats, name=f"bench run {i}",
                                    config=RunConfig(epochs=1000), enqueue=False) for i in range(runs)]
    for run in launched[:-1]:
        _finish(run, statuses={}, log=log)
        training_id = run.training_run.pk
        metric_services.metrics_record(training_run_id=training_id, points=_points(range(1, 101), 50))
        result_records.checkpoints_register(training_run_id=training_id, checkpoints=[
            {"epoch": e, "path": f"{run.output_dir}/checkpoints/{e}", "train_loss": 1.0, "val_loss": 1.1,
             "is_best": e == 1, "val_metrics": {"full_acc_0": 0.5, "cond_acc_0": 0.5}} for e in range(2)])
        reviews.review_add(user=user, subject=run, decision="approve", text="curves look right")
    return user, launched[-1]


def people_add(count: int) -> list[str]:
    """`count` users of their own (each viewer or client signs in as a different person, so nothing kept
    for one person serves another), with the same password hashed once; returns their names."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password

    user_model = get_user_model()
    names = [f"person{i}" for i in range(count)]
    password = make_password(PASSWORD)
    user_model.objects.bulk_create([user_model(username=name, password=password) for name in names])
    return names


class Writer(threading.Thread):
    """What a training worker writes while it trains: a batch of metric points every 2 s and its progress."""

    def __init__(self, *, run, steps_per_second: float, history_steps: int):
        super().__init__(daemon=True)
        from runs.pipeline.lifecycle import stage_services
        from runs.tracking import services as metric_services
        from runs.models import TrainingRun

        _finish(run, statuses={"train": "running", "evaluate": "queued"}, log="")
        self.services, self.rate, self.step = stage_services, steps_per_second, history_steps
        self.record_id, self.total = run.training_run.pk, history_steps * 20
        self.started_at = TrainingRun.objects.get(pk=self.record_id).started_at
        metric_services.metrics_record(training_run_id=self.record_id, points=_points(range(1, history_steps + 1), 250))
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from runs.tracking.services import metrics_record

        try:
            while not self.stop.wait(FLUSH_SECONDS):
                steps = range(self.step + 1, self.step + 1 + round(self.rate * FLUSH_SECONDS))
                metrics_record(training_run_id=self.record_id, points=_points(steps, 250))
                self.step = steps[-1]
                self.services.stage_progress(stage_name="train", record_id=self.record_id, done=self.step,
                                             total=self.total, log_tail=f"step {self.step}", started_at=self.started_at)
        finally:
            connection.close()
