"""A run launched through the service finishes all five stages in a real Celery worker process,
over Redis and PostgreSQL."""
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from runs.pipeline import services
from runs.models import MetricSeries, PipelineRun, StageStatus, Verification
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.worker import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_pipeline_finishes_every_stage_in_a_celery_worker(tiny_target, worker, user):
    run = services.run_launch(
        user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
        config=RunConfig(max_samples=40, max_seq_len=256, draft_vocab_size=256, epochs=2, ttt_steps=2),
    )
    summary = wait_for_run(run.pk, timeout=600, log_path=worker.log_path)
    assert Verification.objects.get(extraction__produced_by__run=run).passed
    # The launch queued the dataset's catalogue too; the same worker ran it from the cpu queue.
    catalogue = run.dataset.catalogues.get()
    assert catalogue.status == StageStatus.SUCCEEDED and catalogue.worker.startswith("test-worker-")
    assert catalogue.samples_total == tiny_target.num_conversations
    # The run's folder holds what `speculators train --data-path` reads (links into the run).
    data = Path(run.output_dir) / "speculators_data"
    assert (data / "hidden_states" / "hs_0.safetensors").is_file() and (data / "state.json").is_file()
    assert (data / "d2t-256.npy").is_file() and (data / "t2d-256.npy").is_file()
    assert summary["speculators_train_command"] == (
        f"speculators train --verifier-name-or-path {tiny_target.target_dir} --data-path {data} "
        "--draft-vocab-size 256 --target-layer-ids 2 4 5 --on-missing raise")

    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, summary["stages"]
    assert all(s["worker"].startswith("test-worker-") for s in summary["stages"])
    assert summary["tokens"]["loss_tokens"] > 0
    assert summary["tokens"]["extracted_tokens"] == summary["tokens"]["total_tokens"]
    manifest = json.loads(open(summary["manifest_path"]).read())
    assert manifest["layer_ids"] == [2, 4, 5, 8]
    assert manifest["num_layers_captured"] == 4
    assert manifest["total_tokens"] == summary["tokens"]["extracted_tokens"]
    assert [c["epoch"] for c in summary["checkpoints"]] == [0, 1]
    assert sum(c["is_best"] for c in summary["checkpoints"]) == 1
    keys = set(MetricSeries.objects.filter(training_run__run=run).values_list("split", "key"))
    for k in range(2):
        assert ("train", f"loss_{k}") in keys and ("val", f"full_acc_{k}") in keys
    acceptance = summary["acceptance"]
    assert acceptance["output_matches_greedy"] is True and 1.0 <= acceptance["tau"] <= 3.0
    assert len(acceptance["acceptance_per_position"]) == 2


def test_run_pipeline_wait_returns_when_the_worker_has_finished(tiny_target, worker, user):
    out = io.StringIO()
    call_command("run_pipeline", "--target", str(tiny_target.target_dir), "--dataset", str(tiny_target.chats_path),
                 "--max-samples", "20", "--max-seq-len", "256", "--draft-vocab-size", "128", "--epochs", "1",
                 "--user", user.username, "--wait", "--timeout", "600", "--json", stdout=out)
    summary = json.loads(out.getvalue())
    assert summary["status"] == "succeeded"
    assert PipelineRun.objects.get(pk=summary["run_id"]).owner == user
    assert len(summary["checkpoints"]) == 1
