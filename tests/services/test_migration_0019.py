"""Migration 0019 stores each checkpoint's proposal length from its config.json where it can still
be read; a checkpoint whose directory is gone stays empty (its serve command falls back)."""
import json

import pytest

from tests.migration_steps import migrate, migrate_to_latest

BEFORE = [("runs", "0018_datasetsample_content_hash")]
AFTER = [("runs", "0019_checkpoint_speculative_tokens")]


@pytest.mark.django_db(transaction=True)
def test_existing_checkpoints_get_their_speculative_tokens(tmp_path):
    old = migrate(BEFORE)
    user = old.get_model("auth", "User").objects.create(username="ana")
    target = old.get_model("runs", "TargetModel").objects.create(
        name="t", path="/t", architecture="a", model_type="llama", num_layers=8, hidden_size=16, vocab_size=100)
    dataset = old.get_model("runs", "Dataset").objects.create(name="d", path="/d")
    run = old.get_model("runs", "PipelineRun").objects.create(owner_id=user.pk, target_id=target.pk,
                                                              dataset_id=dataset.pk)
    training = old.get_model("runs", "TrainingRun").objects.create(run=run, epochs=2, lr=1e-3, ttt_steps=1)
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 6}]}}))
    Checkpoint = old.get_model("runs", "Checkpoint")
    readable = Checkpoint.objects.create(training_run=training, epoch=0, path=str(tmp_path / "0"))
    gone = Checkpoint.objects.create(training_run=training, epoch=1, path=str(tmp_path / "1"))

    new = migrate(AFTER)
    Checkpoint = new.get_model("runs", "Checkpoint")
    assert Checkpoint.objects.get(pk=readable.pk).speculative_tokens == 6
    assert Checkpoint.objects.get(pk=gone.pk).speculative_tokens is None
    migrate_to_latest()
