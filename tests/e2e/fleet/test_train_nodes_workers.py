"""A training across two nodes (train_nodes=2) against real Celery workers, PostgreSQL, Redis and torchrun
(c10d rendezvous, gloo on the CPU): two workers with different names on this machine stand for two hosts.

Both workers hold a rank and the losses are one process's over the same global batches (the tolerance is
tests/stages/train/test_train_nodes.py's: the same float32 sums taken in another order); a rank's training
process SIGKILLed ends the attempt on both ranks with no process left behind, and Retry resumes from the
last saved state; a gang that never forms fails within its timeout naming the missing rank.
"""
import os
import signal
import time

import psutil
import pytest

from runs.models import Checkpoint, MetricSeries, StageAttempt, StageStatus, TrainingNode, TrainingRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.curves import series_points
from tests.helpers.fleet import cpu_worker
from tests.helpers.worker import celery_worker, started_here, wait_for_run


pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENV = {"EAGLE3WEB_STAGE_LEASE_SECONDS": "10", "EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS": "60",
       "EAGLE3WEB_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}
TOLERANCE = 1e-4


def _config(**changes) -> RunConfig:
    return RunConfig(**{"max_samples": 40, "max_seq_len": 256, "draft_vocab_size": 256, "epochs": 2, "ttt_steps": 2,
                        "eval_prompts": 2, "eval_max_new_tokens": 8, "train_nodes": 2, **changes})


def _wait(predicate, *, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)
    return found


def _ours(proc: psutil.Process) -> bool:
    """A process of a training across nodes: a torchrun or one of its ranks."""
    try:
        line = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "workers.stages.train.processes.in_rank" in line and started_here(proc)


def _rank_process(rank: int) -> psutil.Process | None:
    for proc in psutil.process_iter():
        try:
            if ("workers.stages.train.processes.in_rank" in " ".join(proc.cmdline()) and "torch.distributed.run" not in
                    " ".join(proc.cmdline()) and proc.environ().get("EAGLE3WEB_TRAIN_NODE_RANK") == str(rank)
                    and started_here(proc)):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


def _two_workers(data_root, tmp_path):
    first = celery_worker(data_root=data_root, log_path=tmp_path / "a.log", extra_env=ENV, name="node-a")
    second = celery_worker(data_root=data_root, log_path=tmp_path / "b.log", extra_env=ENV, name="node-b", purge=False)
    return first, second


def _live_workers(count: int) -> None:
    from runs.fleet.selectors import workers_live

    _wait(lambda: workers_live().count() >= count, timeout=60, what=f"{count} live workers")


def test_two_workers_each_hold_a_rank_and_train_one_process_losses(tiny_target, data_root, tmp_path, user):
    first, second = _two_workers(data_root, tmp_path)
    with first, second:
        _live_workers(2)
        run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                                  config=_config())
        summary = wait_for_run(run.pk, timeout=600, log_path=tmp_path / "a.log")
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    nodes = summary["training"]["nodes"]
    assert [n["rank"] for n in nodes] == [0, 1] and [n["status"] for n in nodes] == ["succeeded"] * 2, nodes
    assert {n["worker"].partition("-")[0] for n in nodes} == {"node"} and nodes[0]["worker"] != nodes[1]["worker"]
    training = TrainingRun.objects.get(run=run)
    assert nodes[0]["worker"] == training.worker  # the stage's worker leads

    from workers.orchestration.stage_runners import train_arguments
    from workers.stages.train.loop import train

    alone: list[dict] = []
    train(**dict(train_arguments(training), out_dir=tmp_path / "one-process"), on_metrics=alone.extend)
    expected = [p["value"] for p in alone if p["split"] == "train" and p["key"] == "loss"]
    got = series_points(series=MetricSeries.objects.get(training_run=training, split="train", key="loss")).values
    assert len(got) == len(expected) == training.steps >= 4, (got, expected)
    assert list(got[:4]) == pytest.approx(expected[:4], rel=TOLERANCE)


def test_a_rank_killed_ends_the_attempt_on_both_and_retry_resumes(tiny_target, data_root, tmp_path, user):
    first, second = _two_workers(data_root, tmp_path)
    with first, second:
        _live_workers(2)
        run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                                  config=_config(epochs=8))
        training = TrainingRun.objects.filter(run=run)
        _wait(lambda: Checkpoint.objects.filter(training_run__run=run, epoch__gte=1).exists(), timeout=400,
              what="the second epoch's checkpoint", poll=0.1)
        victim = _wait(lambda: _rank_process(1), timeout=10, what="rank 1's training process")
        os.kill(victim.pid, signal.SIGKILL)
        _wait(lambda: training.get().status == StageStatus.FAILED, timeout=120, what="the training to fail")
        # Both ranks' torchruns and their processes end: nothing of the attempt is left on this host.
        _wait(lambda: not any(_ours(p) for p in psutil.process_iter()), timeout=30, what="no rank process left")
        ranks = {n.rank: n for n in TrainingNode.objects.filter(training=training.get(), attempt=1)}
        assert ranks[1].status == "failed" and ranks[0].status == "failed", ranks
        assert "rank 1" in training.get().error, training.get().error
        services.run_retry(run=run, user=user)
        summary = wait_for_run(run.pk, timeout=600, log_path=tmp_path / "a.log")
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    attempts = list(StageAttempt.objects.filter(run=run, stage="train").order_by("number"))
    assert [a.outcome for a in attempts] == ["failed", "succeeded"]
    assert training.get().resumed_from_step > 0  # from the first attempt's saved state, not from scratch
    assert [n["attempt"] for n in summary["training"]["nodes"]] == [2, 2]
    assert sorted(Checkpoint.objects.filter(training_run__run=run).values_list("epoch", flat=True)) == list(range(8))


def test_a_gang_that_never_forms_fails_within_its_timeout_naming_the_missing_rank(tiny_target, data_root, tmp_path,
                                                                                  user):
    env = {**ENV, "EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS": "8"}
    with celery_worker(data_root=data_root, log_path=tmp_path / "a.log", extra_env=env, name="node-a"):
        _live_workers(1)
        cpu_worker("gone@another-host")  # live at the launch, stopped before the training: takes no message
        run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                                  config=_config(epochs=1))
        summary = wait_for_run(run.pk, timeout=400, log_path=tmp_path / "a.log")
    training = TrainingRun.objects.get(run=run)
    assert training.status == StageStatus.FAILED, summary["stages"]
    assert "gang of 2 nodes was not complete within 8 s" in training.error and "rank 1 was taken by no worker" \
        in training.error, training.error
    waited = (training.finished_at - training.started_at).total_seconds()
    assert 8 <= waited < 30, waited
    assert [(n["rank"], n["status"]) for n in summary["training"]["nodes"]] == [(0, "failed"), (1, "failed")]
    assert not any(_ours(p) for p in psutil.process_iter())  # it never started torchrun
