"""Faults a long run meets, against real Celery workers, PostgreSQL and Redis.

A worker is SIGKILLed in the middle of a stage; a second worker, started afterwards, finds the lapsed
lease, queues the stage again and resumes it where the first one stopped: extraction keeps every
sample already written whole, training continues from its last saved state.
"""
import re
import time
from pathlib import Path

import pytest

from runs.pipeline import services
from runs.tracking.curves import series_points
from runs.models import Checkpoint, ExtractStage, Extraction, MetricSeries, StageAttempt, StageStatus, TrainingRun
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.worker import celery_worker, kill_worker_hard, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Short enough that a lost worker is noticed within seconds, long enough that a worker on a busy
# 2-core machine renews it in time (at 3 s, a prepare stalled by the load was taken for lost).
SHORT_LEASE = {"EAGLE3WEB_STAGE_LEASE_SECONDS": "6"}


def wait_until(predicate, *, timeout: float, what: str, poll: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def samples_on_disk(hs_dir: Path) -> dict[str, tuple[int, int]]:
    """hs_{i}.safetensors -> (mtime_ns, inode); the stage renames each file into place only once it
    is whole, so every file with that name is a complete sample."""
    if not hs_dir.is_dir():
        return {}
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in hs_dir.glob("hs_*.safetensors")}


def assert_attempts(run, stage: str) -> list[StageAttempt]:
    attempts = list(StageAttempt.objects.filter(run=run, stage=stage).order_by("number"))
    assert [a.outcome for a in attempts] == ["failed", "succeeded"]
    assert "stopped renewing its lease" in attempts[0].error and "queued again" in attempts[0].error
    return attempts


def test_a_worker_killed_during_extraction_is_replaced_and_no_sample_is_extracted_twice(
        tiny_target, data_root, tmp_path, user):
    # One row per forward on one thread: the ~280 rows take seconds, time enough to kill mid-way.
    env = {**SHORT_LEASE, "EAGLE3WEB_EXTRACT_BATCH_TOKENS": "1", "EAGLE3WEB_TORCH_THREADS": "1"}
    with celery_worker(data_root=data_root, log_path=tmp_path / "first.log", extra_env=env) as first:
        run = services.run_launch(
            user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
            config=RunConfig(max_seq_len=256, draft_vocab_size=256, epochs=1, ttt_steps=1, eval_prompts=2,
                             eval_max_new_tokens=8),
        )
        hs_dir = Path(run.output_dir) / "extraction" / "hidden_states"
        wait_until(lambda: len(samples_on_disk(hs_dir)) >= 20, timeout=300, poll=0.02,
                   what="extraction to have written 20 samples")
        kill_worker_hard(first)
    time.sleep(0.5)  # the pool process dies with the group; let the kernel finish with it
    whole = samples_on_disk(hs_dir)
    assert not (hs_dir.parent / "data_config.json").exists(), "the extraction finished before the kill"
    assert ExtractStage.objects.get(run=run).status == StageStatus.RUNNING
    with celery_worker(data_root=data_root, log_path=tmp_path / "second.log", extra_env=env):
        summary = wait_for_run(run.pk, timeout=600, log_path=tmp_path / "second.log")
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    assert_attempts(run, "extract")
    manifest = Extraction.objects.get(produced_by__run=run).manifest.data
    total = manifest["total_samples"]
    assert 20 <= len(whole) < total
    # the retry kept every sample the lost attempt wrote, untouched, and extracted only the others
    assert manifest["samples_reused"] == len(whole)
    after = samples_on_disk(hs_dir)
    assert len(after) == total and all(after[name] == stat for name, stat in whole.items())
    assert 0 < manifest["tokens_extracted"] < manifest["total_tokens"]
    assert summary["acceptance"]["output_matches_greedy"] is True


# Killed once the second epoch has ended, with four still to train: an epoch of this run can take under
# a second on a quiet host, and with one left the run once finished between the wait's poll and the kill.
EPOCHS = 6


def test_a_worker_killed_during_training_is_replaced_and_training_resumes(tiny_target, data_root, tmp_path, user):
    with celery_worker(data_root=data_root, log_path=tmp_path / "first.log", extra_env=SHORT_LEASE) as first:
        # Launched once the worker is up: starting a test worker purges the queues.
        run = services.run_launch(
            user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
            config=RunConfig(max_samples=40, max_seq_len=256, draft_vocab_size=256, epochs=EPOCHS, ttt_steps=2,
                             eval_prompts=2, eval_max_new_tokens=8),
        )
        training = TrainingRun.objects.filter(run=run)
        # a second epoch's checkpoint means the first epoch's resume state is on disk
        wait_until(lambda: Checkpoint.objects.filter(training_run__run=run, epoch__gte=1).exists(), timeout=300,
                   what="training's second epoch to end", poll=0.1)
        kill_worker_hard(first)  # at once: nothing read between the wait and the kill
    loss = MetricSeries.objects.get(training_run__run=run, split="train", key="loss")
    first_value = series_points(series=loss).values[0]
    assert training.get().status == StageStatus.RUNNING  # nobody is left to say otherwise
    with celery_worker(data_root=data_root, log_path=tmp_path / "second.log", extra_env=SHORT_LEASE):
        summary = wait_for_run(run.pk, timeout=600, log_path=tmp_path / "second.log")
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    attempts = assert_attempts(run, "train")
    # resumed, not restarted: from a saved step, keeping the curve the first attempt drew up to it
    resumed = re.search(r"resumed from step (\d+)", attempts[1].log_tail)
    assert resumed and int(resumed[1]) > 0, attempts[1].log_tail
    assert training.get().resumed_from_step == int(resumed[1])  # stored, and shown on the page
    for series in MetricSeries.objects.filter(training_run__run=run):
        steps = series_points(series=series).steps
        assert len(steps) == series.num_points and (steps[1:] > steps[:-1]).all(), series  # no step twice
        assert series.num_refused == 0, series
    loss = series_points(series=MetricSeries.objects.get(training_run__run=run, split="train", key="loss"))
    assert loss.values[0] == first_value  # the first attempt's point, kept
    assert loss.steps.tolist() == list(range(1, training.get().steps + 1))
    assert list(Checkpoint.objects.filter(training_run__run=run).values_list("epoch", flat=True)) == list(range(EPOCHS))
    assert summary["acceptance"]["output_matches_greedy"] is True
