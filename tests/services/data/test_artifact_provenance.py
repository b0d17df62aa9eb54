"""Executions apart from artifacts: an extraction or a checkpoint was either written by a run's stage
or imported by someone, never both, never neither; importing what a run wrote links to the run; a
retried stage keeps one artifact."""
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from runs.pipeline import services
from runs.data.extractions import extraction_import
from runs.models import Checkpoint, ExtractStage, Extraction, PipelineRun, StageAttempt, StageStatus
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.result_records import checkpoints_register, extraction_record
from runs.pipeline.lifecycle.stage_services import (
    StageCancelled,
    stage_record_id,
    stage_start,
    stages_reconcile,
)
from tests.contract.test_verify import LENGTHS, write_flat

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(tmp_path, user, config_only_target, django_capture_on_commit_callbacks) -> PipelineRun:
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    with django_capture_on_commit_callbacks(execute=False):
        return services.run_launch(user=user, target_path=config_only_target, dataset_path=chats,
                                   config=RunConfig(draft_vocab_size=32))


def extract_result(directory: Path, *, tokens_per_second: float = 48.0):
    """What the extract stage returns for the files at `directory` (the stage itself needs a model)."""
    from workers.stages.extract.output.result import ExtractionResult

    on_disk = sum(p.stat().st_size for p in (directory / "hidden_states").iterdir())
    return ExtractionResult(
        out_dir=directory, hidden_states_dir=directory / "hidden_states", manifest_path=directory / "data_config.json",
        num_samples=len(LENGTHS), total_tokens=sum(LENGTHS), layer_ids=[2, 4, 5, 7], hidden_size=16,
        num_layers_captured=4, dtype="bfloat16", model_load_seconds=1.5, forward_seconds=0.5, total_time_seconds=2.0,
        tokens_per_second=tokens_per_second, bytes_on_disk=on_disk, bytes_per_token=on_disk / sum(LENGTHS),
        floor_bytes_per_token=4 * 16 * 2, device="cpu")


def extract_once(run: PipelineRun, directory: Path, **result) -> Extraction:
    """One attempt of the run's extract stage that writes `directory` and succeeds."""
    stage_id = stage_record_id(stage_name="extract", run_id=run.pk)
    started = stage_start(stage_name="extract", record_id=stage_id, worker="w")
    return extraction_record(record_id=stage_id, result=extract_result(directory, **result), log_tail="done",
                             started_at=started.started_at)


def test_a_run_produced_extraction_names_its_stage_and_no_importer(run, tmp_path):
    extraction = extract_once(run, write_flat(tmp_path / "run-ext"))
    stage = ExtractStage.objects.get(run=run)
    assert extraction.produced_by == stage and stage.extraction == extraction
    assert (extraction.imported_by, extraction.imported_at, extraction.imported_from) == (None, None, "")
    assert extraction.run == run and extraction.path == str(tmp_path / "run-ext")
    # The stage keeps what its execution measured; the artifact what is on disk.
    assert (stage.status, stage.device, stage.tokens_per_second, stage.model_load_seconds) == (
        StageStatus.SUCCEEDED, "cpu", 48.0, 1.5)
    assert (extraction.total_tokens, extraction.hidden_size, extraction.layout) == (sum(LENGTHS), 16, "flat_v1")
    assert extraction.manifest.path == str(tmp_path / "run-ext" / "data_config.json")
    assert extraction.latest_verification is not None


def test_an_import_names_who_when_and_from_where_and_invents_no_stage(tmp_path, user, config_only_target):
    before = timezone.now()
    extraction, created = extraction_import(path=write_flat(tmp_path / "theirs"), target_path=config_only_target,
                                            user=user)
    assert created and extraction.produced_by is None and extraction.run is None
    assert extraction.imported_by == user and extraction.imported_at >= before
    assert extraction.imported_from == str(tmp_path / "theirs")
    assert ExtractStage.objects.count() == 0 and StageAttempt.objects.count() == 0


def test_importing_a_directory_a_run_wrote_returns_the_runs_extraction(run, tmp_path, user, config_only_target):
    produced = extract_once(run, write_flat(tmp_path / "run-ext"))
    again, created = extraction_import(path=tmp_path / "run-ext", target_path=config_only_target, user=user)
    assert not created and again == produced and again.produced_by.run_id == run.pk and again.imported_by is None
    assert Extraction.objects.count() == 1


def test_a_retried_extract_stage_updates_its_one_extraction(run, tmp_path, user):
    first = extract_once(run, write_flat(tmp_path / "first"), tokens_per_second=48.0)
    stage_id = first.produced_by_id
    # The stage runs again (a later step failed it; retried): the files change, the artifact is the same row.
    ExtractStage.objects.filter(pk=stage_id).update(status=StageStatus.FAILED)
    services.run_retry(run=run, user=user)
    second = extract_once(run, write_flat(tmp_path / "second"), tokens_per_second=96.0)
    assert Extraction.objects.count() == 1 and second.pk == first.pk
    assert second.path == str(tmp_path / "second")
    assert ExtractStage.objects.get(pk=stage_id).tokens_per_second == 96.0
    assert StageAttempt.objects.filter(stage="extract", record_id=stage_id).count() == 2


def test_an_attempt_replaced_after_its_lease_lapsed_leaves_no_artifact(run, tmp_path,
                                                                     django_capture_on_commit_callbacks):
    stage_id = stage_record_id(stage_name="extract", run_id=run.pk)
    lost = stage_start(stage_name="extract", record_id=stage_id, worker="lost")
    ExtractStage.objects.filter(pk=stage_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=False):
        stages_reconcile()
    replacement = stage_start(stage_name="extract", record_id=stage_id, worker="new")
    with pytest.raises(StageCancelled):  # the lost worker comes back late with its result
        extraction_record(record_id=stage_id, result=extract_result(write_flat(tmp_path / "late")), log_tail="",
                          started_at=lost.started_at)
    assert Extraction.objects.count() == 0
    extraction_record(record_id=stage_id, result=extract_result(write_flat(tmp_path / "new")), log_tail="",
                      started_at=replacement.started_at)
    assert list(Extraction.objects.values_list("path", flat=True)) == [str(tmp_path / "new")]


def test_a_cancelled_extract_stage_records_no_artifact(run, tmp_path, user):
    stage_id = stage_record_id(stage_name="extract", run_id=run.pk)
    started = stage_start(stage_name="extract", record_id=stage_id, worker="w")
    services.run_cancel(run=run, user=user)
    with pytest.raises(StageCancelled):
        extraction_record(record_id=stage_id, result=extract_result(write_flat(tmp_path / "e")), log_tail="",
                          started_at=started.started_at)
    assert Extraction.objects.count() == 0


def test_training_waits_for_the_runs_extraction_and_says_so(run):
    train_id = stage_record_id(stage_name="train", run_id=run.pk)
    assert stage_start(stage_name="train", record_id=train_id) is None
    assert PipelineRun.objects.get(pk=run.pk).training_run.error == (
        f"run {run.pk} has no extraction to train on: its extract stage did not succeed")


def _refused(model, **fields) -> bool:
    try:
        with transaction.atomic():
            model.objects.create(**fields)
    except IntegrityError as exc:
        return "produced_or_imported" in str(exc) or "trained_or_imported" in str(exc)
    return False


def test_the_database_refuses_an_extraction_with_both_provenances_or_neither(run, user):
    common = {"target": run.target, "path": "/data/x"}
    assert _refused(Extraction, **common)  # neither
    assert _refused(Extraction, **common, produced_by=run.extract_stage, imported_at=timezone.now())
    assert _refused(Extraction, **common, produced_by=run.extract_stage, imported_by=user)
    assert _refused(Extraction, **common, imported_by=user)  # who, but not when
    assert Extraction.objects.count() == 0
    Extraction.objects.create(**common, produced_by=run.extract_stage)
    Extraction.objects.create(**common, imported_at=timezone.now())  # an import whose user is gone
    assert Extraction.objects.count() == 2


def test_checkpoint_provenance_trained_here_or_imported(run, user, client):
    trained, = checkpoints_register(training_run_id=run.training_run.pk, checkpoints=[{"epoch": 0, "path": "/c/0"}])
    assert trained.training_run_id == run.training_run.pk and (trained.imported_by, trained.imported_at) == (None, None)
    assert _refused(Checkpoint, epoch=1, path="/c/1")  # neither
    assert _refused(Checkpoint, epoch=1, path="/c/1", training_run=run.training_run, imported_at=timezone.now())
    assert _refused(Checkpoint, epoch=1, path="/c/1", imported_by=user)
    imported = Checkpoint.objects.create(epoch=3, path="/c/imported", imported_by=user, imported_at=timezone.now())
    client.force_login(user)
    page = client.get(imported.get_absolute_url()).content.decode()
    assert f"Imported by {user.username} on {timezone.localtime(imported.imported_at):%Y-%m-%d %H:%M}" in page
    page = client.get(trained.get_absolute_url()).content.decode()
    # The trainer's epoch 0: pages count epochs from 1.
    assert f'Epoch 1 of <a href="{run.get_absolute_url()}">' in page


def test_the_extraction_page_says_where_it_came_from(run, tmp_path, user, client, config_only_target):
    produced = extract_once(run, write_flat(tmp_path / "run-ext"))
    imported, _ = extraction_import(path=write_flat(tmp_path / "theirs"), target_path=config_only_target, user=user)
    client.force_login(user)
    page = client.get(produced.get_absolute_url()).content.decode()
    assert f'Written by the extract stage of <a href="{run.get_absolute_url()}">{run}</a>' in page
    assert "48 tokens/s" in page  # what the stage measured, shown with its artifact
    page = client.get(imported.get_absolute_url()).content.decode()
    when = timezone.localtime(imported.imported_at)
    assert (f"Imported by {user.username} on {when:%Y-%m-%d %H:%M} from <code>{tmp_path / 'theirs'}</code>") in page
    listing = client.get("/extractions/").content.decode()
    assert f"imported by {user.username}" in listing and run.get_absolute_url() in listing
    summary = client.get(f"/api/v1/runs/{run.pk}/status/").json()
    assert summary["ids"]["extraction"] == summary["extraction"]["id"] == produced.pk
    assert summary["ids"]["extract_stage"] == produced.produced_by_id
    assert summary["extraction"]["hidden_states_dir"] == f"{tmp_path / 'run-ext'}/hidden_states"
    assert [s["name"] for s in summary["stages"]][1] == "extract" and summary["stages"][1]["device"] == "cpu"
