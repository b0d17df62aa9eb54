"""Migration 0012 converts the rows a team already has: a run's extraction row becomes its
ExtractStage and, once it wrote files, its Extraction, both with the old id (so /extractions/<id>/
and the stage's attempts still answer); an imported one becomes an artifact only; an imported
checkpoint keeps its provenance. And back again."""
import pytest

from tests.migration_steps import migrate, migrate_to_latest

BEFORE = [("runs", "0011_enqueue_outbox")]
AFTER = [("runs", "0012_extract_stage_and_artifact_provenance")]


@pytest.mark.django_db(transaction=True)
def test_existing_extractions_and_checkpoints_are_split_by_provenance():
    old = migrate(BEFORE)
    user = old.get_model("auth", "User").objects.create(username="ana")
    target = old.get_model("runs", "TargetModel").objects.create(
        name="t", path="/t", architecture="a", model_type="llama", num_layers=8, hidden_size=16, vocab_size=100)
    dataset = old.get_model("runs", "Dataset").objects.create(name="d", path="/d")
    Run, Extraction = old.get_model("runs", "PipelineRun"), old.get_model("runs", "Extraction")
    runs = [Run.objects.create(owner=user, target=target, dataset=dataset) for _ in range(2)]
    imported = Extraction.objects.create(target=target, status="succeeded", imported=True, out_dir="/data/theirs")
    written = Extraction.objects.create(run=runs[0], target=target, status="succeeded", out_dir="/runs/1/extraction",
                                        layer_ids=[2, 4, 8], device="cpu", tokens_per_second=100.0)
    queued = Extraction.objects.create(run=runs[1], target=target, layer_ids=[2, 4, 8])
    old.get_model("runs", "StageAttempt").objects.create(run=runs[0], stage="extract", record_id=written.pk,
                                                          number=1, started_at=written.queued_at)
    training = old.get_model("runs", "TrainingRun").objects.create(run=runs[0], epochs=1, lr=0.1, ttt_steps=1)
    Checkpoint = old.get_model("runs", "Checkpoint")
    trained = Checkpoint.objects.create(training_run=training, epoch=0, path="/runs/1/checkpoints/0")
    brought = Checkpoint.objects.create(training_run=None, imported=True, epoch=2, path="/data/ckpt")

    new = migrate(AFTER)
    Extraction, Stage = new.get_model("runs", "Extraction"), new.get_model("runs", "ExtractStage")
    artifact = Extraction.objects.get(pk=written.pk)
    stage = Stage.objects.get(pk=written.pk)
    assert (artifact.produced_by_id, artifact.path, artifact.imported_at) == (stage.pk, "/runs/1/extraction", None)
    assert (stage.run_id, stage.status, stage.device, stage.tokens_per_second) == (runs[0].pk, "succeeded", "cpu", 100.0)
    theirs = Extraction.objects.get(pk=imported.pk)
    assert theirs.produced_by_id is None and theirs.imported_from == "/data/theirs" and theirs.imported_at is not None
    # A stage that never wrote anything has no artifact; its row keeps its id.
    assert not Extraction.objects.filter(pk=queued.pk).exists()
    assert Stage.objects.get(pk=queued.pk).status == "queued"
    assert new.get_model("runs", "StageAttempt").objects.get().record_id == stage.pk
    Checkpoint = new.get_model("runs", "Checkpoint")
    assert Checkpoint.objects.get(pk=trained.pk).imported_at is None
    assert Checkpoint.objects.get(pk=brought.pk).imported_at is not None
    # New stages take ids after the copied ones.
    third = new.get_model("runs", "PipelineRun").objects.create(owner_id=user.pk, target_id=target.pk,
                                                                dataset_id=dataset.pk)
    assert Stage.objects.create(run=third, target_id=target.pk).pk > queued.pk

    old = migrate(BEFORE)
    rows = {e.run_id: e for e in old.get_model("runs", "Extraction").objects.all()}
    assert rows[None].imported and rows[None].out_dir == "/data/theirs"
    assert (rows[runs[0].pk].pk, rows[runs[0].pk].status, rows[runs[0].pk].device) == (written.pk, "succeeded", "cpu")
    assert rows[runs[1].pk].status == "queued"
    assert old.get_model("runs", "Checkpoint").objects.get(pk=brought.pk).imported
    migrate_to_latest()  # the later migrations too: the test database is left as it was
