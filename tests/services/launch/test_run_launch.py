import json

import pytest
from django.contrib.auth import get_user_model

from runs.pipeline import services
from runs.pipeline.status.changes import CounterBump
from runs.models import PipelineRun, StageStatus, TargetModel
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.lifecycle.stage_services import stage_fail, stage_record_id, stage_start, stage_succeed
from runs.data.paths import PathNotAllowed
from workers.contract.target import TargetConfigError

pytestmark = pytest.mark.django_db


def handed_over(callbacks) -> list:
    """The hand-overs to the queue among what runs on commit (the runs' change counters move there too)."""
    return [c for c in callbacks if not isinstance(c, CounterBump)]


def rid(run, stage_name: str) -> int:
    return stage_record_id(stage_name=stage_name, run_id=run.pk)


def launch(roots, user, **config):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(**config))


def test_launch_creates_five_queued_stages_and_enqueues_after_commit(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = launch(roots, user)
    assert len(handed_over(callbacks)) == 2  # the run's first stage, and the catalogue of the dataset it registered
    stages = [run.preparation, run.extract_stage, run.vocab_mapping, run.training_run, run.evaluation]
    assert [s.status for s in stages] == [StageStatus.QUEUED] * 5
    assert (run.evaluation.max_prompts, run.evaluation.max_new_tokens) == (32, 64)
    assert run.output_dir.endswith(f"run-{run.pk}")


def test_launch_uses_eagle3_default_layers_for_the_target(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    assert run.extract_stage.layer_ids == [2, 4, 5, 8]
    assert run.config["layer_ids"] == [2, 4, 5, 8]


def test_launch_appends_the_final_layer_to_aux_ids(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user, layer_ids=[1, 3, 6])
    assert run.extract_stage.layer_ids == [1, 3, 6, 8]


def test_launch_reads_nested_text_config(roots, user, django_capture_on_commit_callbacks):
    nested = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
    (roots / "target" / "config.json").write_text(json.dumps(nested))
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    assert (run.target.num_layers, run.target.hidden_size) == (61, 7168)
    assert run.extract_stage.layer_ids == [2, 30, 58, 61]


def test_launch_refuses_layer_ids_outside_the_target_and_stores_nothing(roots, user):
    with pytest.raises(TargetConfigError, match=r"layer ids \[9\] are outside this target: valid ids are 0..8"):
        launch(roots, user, layer_ids=[2, 9])
    assert PipelineRun.objects.count() == 0
    assert TargetModel.objects.count() == 0


def test_launch_refuses_dataset_outside_roots(roots, user, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text("{}\n")
    with pytest.raises(PathNotAllowed, match="outside the allowed data roots"):
        services.run_launch(user=user, target_path=roots / "target", dataset_path=outside, config=RunConfig())
    assert PipelineRun.objects.count() == 0


def test_launch_refuses_draft_vocab_larger_than_target_vocab(roots, user):
    with pytest.raises(RunConfigError, match="draft_vocab_size 6000 is larger than the target's vocabulary"):
        launch(roots, user, draft_vocab_size=6000)


def test_run_config_names_a_bad_value():
    with pytest.raises(RunConfigError, match="epochs must be between 1 and 1000, got 0"):
        RunConfig(epochs=0)


def test_cancel_marks_unfinished_stages_and_a_started_stage_sees_it(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    assert stage_start(stage_name="prepare", record_id=rid(run, "prepare"), worker="w1") is not None
    assert services.run_cancel(run=run, user=user) == 5
    run.refresh_from_db()
    run.preparation.refresh_from_db()
    assert run.preparation.status == StageStatus.CANCELLED
    assert "cancelled by launcher" in run.preparation.error
    assert stage_start(stage_name="extract", record_id=rid(run, "extract"), worker="w1") is None


def test_a_failed_stage_cancels_the_stages_after_it(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    stage_start(stage_name="prepare", record_id=rid(run, "prepare"), worker="w1")
    stage_fail(stage_name="prepare", record_id=rid(run, "prepare"), error="DatasetFormatError: line 3", log_tail="")
    run = PipelineRun.objects.get(pk=run.pk)
    assert run.preparation.status == StageStatus.FAILED
    assert run.training_run.status == StageStatus.CANCELLED
    assert run.training_run.error == "not started: prepare did not succeed"


def test_a_viewer_may_not_launch_and_nothing_is_stored(roots):
    from django.contrib.auth.models import Group
    from django.core.exceptions import PermissionDenied

    viewer = get_user_model().objects.create_user("viewer", password="pw-viewer-1")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    with pytest.raises(PermissionDenied, match="viewer may not launch: ask an admin for the admin or launcher role"):
        launch(roots, viewer)
    assert PipelineRun.objects.count() == 0


def test_retry_requeues_failed_and_cancelled_stages_only(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    for name in ("prepare", "extract", "vocab"):
        stage_start(stage_name=name, record_id=rid(run, name))
        stage_succeed(stage_name=name, record_id=rid(run, name), fields={}, log_tail="")
    stage_start(stage_name="train", record_id=rid(run, "train"))
    stage_fail(stage_name="train", record_id=rid(run, "train"), error="ValueError: extraction failed verification", log_tail="")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.run_retry(run=run, user=user) == 2  # train, and evaluate that it cancelled
    run = PipelineRun.objects.get(pk=run.pk)
    assert run.training_run.status == StageStatus.QUEUED and run.training_run.error == ""
    assert run.evaluation.status == StageStatus.QUEUED
    assert run.preparation.status == StageStatus.SUCCEEDED
    assert len(handed_over(callbacks)) == 1


def test_training_does_not_start_on_an_unverified_extraction_and_says_why(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    assert stage_start(stage_name="train", record_id=rid(run, "train"), worker="w1") is None
    run = PipelineRun.objects.get(pk=run.pk)
    assert run.training_run.status == StageStatus.FAILED
    assert run.training_run.error == f"run {run.pk} has no extraction to train on: its extract stage did not succeed"
    assert run.evaluation.status == StageStatus.CANCELLED


def test_each_execution_is_an_attempt_and_a_retry_keeps_the_earlier_one(roots, user, django_capture_on_commit_callbacks,
                                                                       client):
    from runs.pipeline import selectors
    from runs.pipeline.status.run_summary import run_summary
    from runs.models import StageAttempt

    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
        stage_start(stage_name="prepare", record_id=rid(run, "prepare"), worker="w1")
        stage_fail(stage_name="prepare", record_id=rid(run, "prepare"), error="OSError: disk full",
                   log_tail="reading chats")
        services.run_retry(run=run, user=user)
        stage_start(stage_name="prepare", record_id=rid(run, "prepare"), worker="w2")
        stage_succeed(stage_name="prepare", record_id=rid(run, "prepare"), fields={}, log_tail="prepared")
    attempts = list(StageAttempt.objects.filter(run=run).order_by("number"))
    assert [(a.number, a.worker, a.outcome) for a in attempts] == [(1, "w1", "failed"), (2, "w2", "succeeded")]
    assert attempts[0].error == "OSError: disk full" and attempts[0].log_tail == "reading chats"
    summary = run_summary(selectors.run_list().get(pk=run.pk))
    assert [(a["stage"], a["number"], a["outcome"]) for a in summary["attempts"]] == [
        ("prepare", 1, "failed"), ("prepare", 2, "succeeded")]
    client.login(username=user.username, password=user.raw_password)
    page = client.get(run.get_absolute_url()).content.decode()
    assert 'data-attempt="prepare-1"' in page and 'data-attempt="prepare-2"' in page
    assert "OSError: disk full" in page


def test_retry_of_a_failure_the_runs_files_caused_is_refused_and_changes_nothing(roots, user, client,
                                                                              django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
        stage_start(stage_name="prepare", record_id=rid(run, "prepare"), worker="w1")
        stage_fail(stage_name="prepare", record_id=rid(run, "prepare"), log_tail="",
                   error="DatasetFormatError: /d/c.jsonl: no training rows: every conversation was excluded")
    before = PipelineRun.objects.get(pk=run.pk).preparation
    assert (before.failure_kind, before.failure_field) == ("inputs", "dataset_path")
    client.login(username=user.username, password=user.raw_password)
    refused = client.post(f"/api/v1/runs/{run.pk}/retry/", content_type="application/json", data={})
    assert refused.status_code == 400
    assert refused.json()["error"] == (
        f"{run} cannot be retried: The dataset has no usable conversation: every conversation was excluded. Pick "
        "another dataset, add assistant replies, or raise max_seq_len if its conversations are longer. The run's "
        "target or dataset caused it: a retry with the same files fails the same way; launch a copy with other "
        "files, or fix them first (change dataset_path).")
    after = PipelineRun.objects.get(pk=run.pk).preparation
    assert (after.status, after.finished_at, after.error) == (StageStatus.FAILED, before.finished_at, before.error)
    page = client.get(run.get_absolute_url()).content.decode()
    assert f'action="/runs/{run.pk}/retry/" hidden>' in page and f"/runs/new/?copy={run.pk}&amp;change=dataset_path" in page


def test_a_retried_training_keeps_its_curves_and_checkpoints_up_to_where_it_resumes(
        roots, user, django_capture_on_commit_callbacks):
    from runs.tracking.curves import series_points
    from runs.models import Checkpoint, MetricSeries, Verification
    from runs.tracking.services import metrics_record
    from runs.pipeline.lifecycle.result_records import checkpoints_register
    from runs.pipeline.lifecycle.stage_services import StageCancelled, training_resume

    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    from tests.helpers.artifacts import extraction_written

    extraction = extraction_written(run, path=f"{run.output_dir}/extraction")
    Verification.objects.create(extraction=extraction, passed=True, layout="flat_v1", seconds=0.1)
    train_id = rid(run, "train")
    first = stage_start(stage_name="train", record_id=train_id, worker="w1").started_at
    assert training_resume(training_run_id=train_id, step=0, epochs_done=0, started_at=first) == 0
    metrics_record(training_run_id=train_id, points=[{"split": split, "key": "loss", "step": s, "epoch": 0.1,
                                                      "value": 1.0} for s in (1, 2, 3, 4) for split in ("train", "val")])
    checkpoints_register(training_run_id=train_id, checkpoints=[{"epoch": 0, "path": "/run/0"},
                                                                {"epoch": 1, "path": "/run/1"}])
    stage_fail(stage_name="train", record_id=train_id, error="RuntimeError: worker lost", log_tail="")
    services.run_retry(run=run, user=user)
    second = stage_start(stage_name="train", record_id=train_id, worker="w2").started_at
    # starting keeps everything: only the training knows where its saved state lets it resume
    assert sum(MetricSeries.objects.filter(training_run_id=train_id).values_list("num_points", flat=True)) == 8
    with pytest.raises(StageCancelled):  # the replaced attempt can no longer drop anything
        training_resume(training_run_id=train_id, step=0, epochs_done=0, started_at=first)
    assert training_resume(training_run_id=train_id, step=2, epochs_done=1, started_at=second) == 4
    assert sorted((series.split, int(step)) for series in MetricSeries.objects.filter(training_run_id=train_id)
                  for step in series_points(series=series).steps) == [
        ("train", 1), ("train", 2), ("val", 1), ("val", 2)]
    assert list(Checkpoint.objects.filter(training_run_id=train_id).values_list("epoch", flat=True)) == [0]
    training_resume(training_run_id=train_id, step=0, epochs_done=0, started_at=second)  # its state was unusable
    assert not MetricSeries.objects.filter(training_run_id=train_id).exists()
    assert not Checkpoint.objects.filter(training_run_id=train_id).exists()


def test_a_stage_whose_worker_stopped_renewing_its_lease_is_queued_again_then_failed(
        roots, user, django_capture_on_commit_callbacks, settings):
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Preparation, StageAttempt
    from runs.pipeline.lifecycle.stage_services import MAX_ATTEMPTS, stages_reconcile

    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    prep = rid(run, "prepare")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        stage_start(stage_name="prepare", record_id=prep, worker=f"w{attempt}")
        assert stages_reconcile() == []  # the lease is live
        Preparation.objects.filter(pk=prep).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            done = stages_reconcile()
        row = Preparation.objects.get(pk=prep)
        if attempt < MAX_ATTEMPTS:
            assert done == [f"prepare {prep} queued again (attempt {attempt + 1} of {MAX_ATTEMPTS})"]
            assert row.status == StageStatus.QUEUED and len(handed_over(callbacks)) == 1
        else:
            assert done == [f"prepare {prep} failed after {MAX_ATTEMPTS} lost attempts"]
            assert row.status == StageStatus.FAILED and f"gave up after {MAX_ATTEMPTS} attempts" in row.error
            assert f"worker w{attempt} stopped renewing its lease" in row.error
    outcomes = list(StageAttempt.objects.filter(stage="prepare", record_id=prep).values_list("outcome", "error"))
    assert [o for o, _ in outcomes] == ["failed"] * MAX_ATTEMPTS
    assert "queued again" in outcomes[0][1]
    assert PipelineRun.objects.get(pk=run.pk).evaluation.status == StageStatus.CANCELLED


def test_a_replaced_attempt_can_no_longer_write_to_the_stage(roots, user, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Preparation
    from runs.pipeline.lifecycle.stage_services import StageCancelled, stage_progress, stages_reconcile

    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
    prep = rid(run, "prepare")
    old = stage_start(stage_name="prepare", record_id=prep, worker="slow").started_at
    Preparation.objects.filter(pk=prep).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=False):
        stages_reconcile()
    stage_start(stage_name="prepare", record_id=prep, worker="fresh")
    with pytest.raises(StageCancelled):
        stage_progress(stage_name="prepare", record_id=prep, done=1, total=2, log_tail="", started_at=old)
    with pytest.raises(StageCancelled):
        stage_succeed(stage_name="prepare", record_id=prep, fields={}, log_tail="", started_at=old)
    stage_fail(stage_name="prepare", record_id=prep, error="late", log_tail="", started_at=old)
    row = Preparation.objects.get(pk=prep)
    assert row.status == StageStatus.RUNNING and row.worker == "fresh" and row.error == ""


def test_cancel_then_retry_at_once_is_not_undone_by_the_stopping_worker(roots, user, django_capture_on_commit_callbacks):
    from runs.models import StageAttempt
    from runs.pipeline.lifecycle.stage_services import StageCancelled, stage_progress

    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user)
        prep = rid(run, "prepare")
        fence = stage_start(stage_name="prepare", record_id=prep, worker="w1").started_at
        services.run_cancel(run=run, user=user)
        services.run_retry(run=run, user=user)
    # The first worker notices only now, at its next progress report, and stops.
    with pytest.raises(StageCancelled):
        stage_progress(stage_name="prepare", record_id=prep, done=1, total=9, log_tail="", started_at=fence)
    stage_fail(stage_name="prepare", record_id=prep, error="stopped", log_tail="", cancelled=True, started_at=fence)
    run = PipelineRun.objects.get(pk=run.pk)
    assert run.preparation.status == StageStatus.QUEUED and run.evaluation.status == StageStatus.QUEUED
    assert list(StageAttempt.objects.filter(record_id=prep, stage="prepare").values_list("outcome", flat=True)) == [
        "cancelled"]
    stage_start(stage_name="prepare", record_id=prep, worker="w2")
    stage_succeed(stage_name="prepare", record_id=prep, fields={}, log_tail="",
                  started_at=run.preparation.__class__.objects.get(pk=prep).started_at)
    assert list(StageAttempt.objects.filter(record_id=prep, stage="prepare").order_by("number")
                .values_list("outcome", flat=True)) == ["cancelled", "succeeded"]


def test_a_launch_while_the_broker_is_down_mocked_is_kept_in_the_outbox_and_sent_later(
        roots, user, django_capture_on_commit_callbacks, monkeypatch):
    from datetime import timedelta

    from runs.pipeline.dispatch import queue
    from runs.models import PendingEnqueue

    sent = []

    def broker_down(kind, object_id):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(queue, "_send", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        run = launch(roots, user)  # no exception reaches the user
    row = PendingEnqueue.objects.get(kind="pipeline", object_id=run.pk)
    assert row.attempts == 1 and "Connection refused" in row.last_error
    monkeypatch.setattr(queue, "_send", lambda kind, object_id: sent.append((kind, object_id)))
    catalogue = PendingEnqueue.objects.get(kind="catalogue")  # the dataset's catalogue waits too
    assert catalogue.attempts == 1 and catalogue.object_id == run.dataset.catalogues.get().pk
    PendingEnqueue.objects.update(created_at=row.created_at - timedelta(seconds=10))
    assert queue.outbox_flush() == 2
    assert sorted(sent) == [("catalogue", catalogue.object_id), ("pipeline", run.pk)]
    assert not PendingEnqueue.objects.exists()
