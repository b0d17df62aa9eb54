"""A run's change counters (runs.pipeline.status.changes) move with every committed write to what its pages
show, whoever writes it, and only then: transactional tests, so that commits happen as in production."""
from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from runs.models import Checkpoint, DatasetCatalogue, Evaluation, PipelineRun, ServeCheck, StageStatus, TrainingRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.result_records import checkpoints_register
from runs.pipeline.lifecycle.stage_services import stage_heartbeat, stage_progress, stage_start, training_resume
from runs.tracking.services import metrics_record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(user, roots):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(), enqueue=False)


def counters(run) -> tuple[int, int, int]:
    return PipelineRun.objects.values_list("changes", "curve_changes", "state_changes").get(pk=run.pk)


def moved(run, write) -> tuple[int, int, int]:
    """How far (changes, curve_changes, state_changes) moved across `write`."""
    before = counters(run)
    write()
    return tuple(after - earlier for after, earlier in zip(counters(run), before))


def _point(step: int) -> list[dict]:
    return [{"split": "train", "key": "loss_0", "step": step, "epoch": 0.0, "value": 1.0}]


def test_each_write_moves_the_counters_of_what_it_changed(run):
    training = run.training_run.pk
    # Points: the pages and the curves, not the state the runs list shows.
    assert moved(run, lambda: metrics_record(training_run_id=training, points=_point(1))) == (1, 1, 0)
    assert moved(run, lambda: stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="w")) == (1, 0, 1)
    record = run.preparation
    # Progress and log: the run's pages only.
    assert moved(run, lambda: stage_progress(stage_name="prepare", record_id=record.pk, done=1, total=2,
                                             log_tail="")) == (1, 0, 0)
    # The heartbeat renews the lease, which no page shows: nothing moves.
    started = type(record).objects.get(pk=record.pk).started_at
    assert moved(run, lambda: stage_heartbeat(stage_name="prepare", record_id=record.pk, started_at=started)) == (0, 0, 0)
    assert moved(run, lambda: checkpoints_register(training_run_id=training, checkpoints=[
        {"epoch": 0, "path": "/nowhere/0"}])) == (1, 0, 1)
    # A resume drops the later points and checkpoints: both count.
    metrics_record(training_run_id=training, points=_point(2))
    assert moved(run, lambda: training_resume(training_run_id=training, step=1, epochs_done=0)) == (2, 1, 1)
    assert not Checkpoint.objects.filter(training_run_id=training).exists()


def test_any_write_to_a_stage_row_counts_even_one_no_service_made(run):
    # As the admin or a shell would: the rows' manager counts it all the same.
    assert moved(run, lambda: TrainingRun.objects.filter(run=run).update(error="edited by hand")) == (1, 0, 1)
    row = TrainingRun.objects.get(run=run)
    row.worker = "renamed"
    assert moved(run, row.save) == (1, 0, 1)
    # A filter that matches nothing writes nothing and counts nothing.
    assert moved(run, lambda: TrainingRun.objects.filter(run=run, status=StageStatus.FAILED).update(error="x")) == (0, 0, 0)


def test_a_rolled_back_write_counts_nothing(run):
    def failed_write():
        with pytest.raises(RuntimeError), transaction.atomic():
            TrainingRun.objects.filter(run=run).update(error="never committed")
            raise RuntimeError("rolled back")

    assert moved(run, failed_write) == (0, 0, 0)
    assert TrainingRun.objects.get(run=run).error == ""


def test_jobs_count_for_the_run_whose_checkpoint_they_measure_and_jobs_of_no_run_for_none(run, user):
    checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=0, path="/nowhere/0")
    other = services.run_launch(user=user, target_path=run.target.path, dataset_path=run.dataset.path,
                                config=RunConfig(), enqueue=False)
    measured = {}
    assert moved(run, lambda: measured.setdefault("e", Evaluation.objects.create(checkpoint=checkpoint))) == (1, 0, 1)
    check = {}
    assert moved(run, lambda: check.setdefault("c", ServeCheck.objects.create(checkpoint=checkpoint))) == (1, 0, 1)
    assert moved(run, lambda: ServeCheck.objects.filter(pk=check["c"].pk).update(
        status=StageStatus.RUNNING, started_at=timezone.now())) == (1, 0, 1)
    # The other run's counters did not move for this run's checkpoint; a catalogue belongs to no run.
    before_other = counters(other)
    DatasetCatalogue.objects.create(dataset=run.dataset)
    DatasetCatalogue.objects.filter(dataset=run.dataset).update(status=StageStatus.RUNNING)
    assert counters(other) == before_other


def test_a_bump_of_several_runs_moves_theirs_once_each_and_no_others(user, roots):
    """The bump's filter is compiled once per shape with a stand-in per id (eagle3web.db): each id
    lands in its own place, whatever the order the ids come in."""
    from runs.pipeline.status.changes import ALL, CounterBump

    runs = [services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                config=RunConfig(), enqueue=False) for _ in range(3)]
    before = [counters(r) for r in runs]
    CounterBump(run_filter=(("pk__in", (runs[2].pk, runs[0].pk)),), counters=ALL)()
    CounterBump(run_filter=(("pk__in", (runs[0].pk, runs[1].pk)),), counters=ALL)()
    moved_by = [tuple(a - b for a, b in zip(counters(r), earlier)) for r, earlier in zip(runs, before)]
    assert moved_by == [(2, 0, 2), (1, 0, 1), (1, 0, 1)]
