"""An online run (issue 27) through the web tier's plumbing: its extract stage writes nothing and says so,
its training is not gated on an extraction, the supply figures its training reports are stored by the
training's record and shown (summary, API, run page), and "keep the cache" turns a whole cache into the
run's own extraction (refused, with the count, while rows are missing)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file

from runs.models import Extraction, Preparation, StageStatus, TrainingRun
from runs.pipeline.online import services as online_services
from runs.pipeline import selectors, services
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.lifecycle.result_records import training_record
from runs.pipeline.lifecycle.stage_services import stage_record_id, stage_start
from workers.stages.train.results import TrainResult
from workers.stages.train.online.source import SupplyReport
from workers.stages.train.holdout.split import SplitInfo

pytestmark = pytest.mark.django_db

URLS = ["http://10.0.0.7:8000", "http://10.0.0.8:8000"]
ROWS = [[1, 5, 9, 2], [7, 3, 3], [4, 4, 8, 1, 6, 2]]


@pytest.fixture
def online_run(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                   config=RunConfig(draft_vocab_size=64, hidden_states="online", capture_servers=0,
                                                    capture_urls=URLS, hidden_states_cache_gib=0.5))


def summary_of(run) -> dict:
    return run_summary(selectors.run_list().get(pk=run.pk))


def supply_report() -> dict:
    """What the lead's loop reports (workers.stages.train.online.SupplyReport), with figures of a run where the
    trainer waited 37.5 % of its step time: supply-bound."""
    return SupplyReport(hidden_states="online", fetch_wait_fraction=0.375, fetch_wait_seconds=4.5,
                        capture_tokens_per_s=1234.5, capture_tokens=9876, capture_seconds=8.0,
                        cache_hit_rate_per_epoch=[0.0, 0.75], peak_cache_bytes=123_400_000,
                        cache_limit_bytes=536_870_912, evictions=3, served_by={URLS[0]: 5, URLS[1]: 4}, retried=1,
                        bound="supply", advice="2 capture servers feed 1 trainer at this size").as_dict()


def record_training(run, tmp_path, supply: dict) -> None:
    training = TrainingRun.objects.get(run=run)
    TrainingRun.objects.filter(pk=training.pk).update(status=StageStatus.RUNNING)
    split = SplitInfo(by="conversation", seed=0, val_fraction=0.1, train_rows=2, val_rows=1, train_conversations=2,
                      val_conversations=1)
    training_record(record_id=training.pk, log_tail="", result=TrainResult(
        out_dir=tmp_path, checkpoints=[], best_epoch=0, steps=4, train_tokens=40, tokens_per_second=10.0, seconds=4.0,
        tokens_per_step=16, loss_tokens_available=10, loss_tokens_trained=10, loss_tokens_per_epoch=[10],
        rows_unusable=0, split=split, device="cpu", supply=supply))


def test_the_extract_stage_of_an_online_run_writes_nothing_and_says_why(online_run):
    from workers.orchestration.tasks import stage_execute

    Preparation.objects.filter(run=online_run).update(status=StageStatus.SUCCEEDED)
    assert stage_execute(stage_name="extract", record_id=stage_record_id(stage_name="extract", run_id=online_run.pk),
                         worker="test") is True
    summary = summary_of(online_run)
    extract = next(s for s in summary["stages"] if s["name"] == "extract")
    note = ("online: hidden states are captured during training (2 running at http://10.0.0.7:8000, "
            "http://10.0.0.8:8000); nothing is extracted here")
    assert extract["status"] == "succeeded" and extract["note"] == note and note in extract["log_tail"]
    assert not Extraction.objects.exists() and summary["ids"]["extraction"] is None
    cache = online_run.output_dir + "/hidden_states_cache"
    assert extract["out_dir"] == cache and summary["supply"]["cache_dir"] == cache
    # Training starts with no extraction to gate (an offline run's would be failed here: "has no extraction").
    started = stage_start(stage_name="train", record_id=stage_record_id(stage_name="train", run_id=online_run.pk))
    assert started is not None and started.status == StageStatus.RUNNING


def test_an_offline_runs_training_without_an_extraction_is_still_refused(
        roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                  config=RunConfig(draft_vocab_size=64))
    assert stage_start(stage_name="train", record_id=stage_record_id(stage_name="train", run_id=run.pk)) is None
    assert "has no extraction to train on" in TrainingRun.objects.get(run=run).error


def test_supply_is_stored_by_the_training_record_and_shown(online_run, tmp_path, client, user):
    record_training(online_run, tmp_path, supply_report())
    assert TrainingRun.objects.get(run=online_run).supply["capture_tokens_per_s"] == 1234.5
    supply = summary_of(online_run)["supply"]
    assert (supply["hidden_states"], supply["bound"], supply["fetch_wait_fraction"], supply["peak_cache_bytes"],
            supply["capture_tokens_per_s"]) == ("online", "supply", 0.375, 123_400_000, 1234.5)
    assert supply["advice"] == "2 capture servers feed 1 trainer at this size"
    rows = {row["key"]: row["text"] for row in supply["rows"]}
    assert rows == {
        "hidden_states": "online: 2 running at http://10.0.0.7:8000, http://10.0.0.8:8000",
        "bound": "supply-bound: the trainer waited for hidden states",
        "fetch_wait_fraction": "37.5 % of step time (4.5 s)",
        "capture_tokens_per_s": "1,234 tokens/s (all servers)",  # 1234.5 rounds half to even
        "cache_hit_rate": "epoch 1: 0 % · epoch 2: 75 %",
        "cache_bytes": "123.4 MB / 536.9 MB (3 evicted)",
        "served_by": "http://10.0.0.7:8000: 5 · http://10.0.0.8:8000: 4",
        "retried": "1 sample(s)",
    }
    assert supply["keep"]["offered"] is True  # the training succeeded
    client.login(username=user.username, password=user.raw_password)
    assert client.get(f"/api/v1/runs/{online_run.pk}/").json()["supply"]["bound"] == "supply"
    page = client.get(online_run.get_absolute_url()).content.decode()
    assert "Hidden-state supply" in page and "supply-bound: the trainer waited for hidden states" in page
    assert "2 capture servers feed 1 trainer at this size" in page and 'id="keep-cache"' in page


def test_an_offline_run_shows_its_source_and_no_keep(roots, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                  config=RunConfig(draft_vocab_size=64))
    supply = summary_of(run)["supply"]
    assert (supply["hidden_states"], supply["measured"], supply["keep"]) == ("offline", False, None)
    assert [row["text"] for row in supply["rows"]][:2] == [
        "offline: the extract stage wrote every sample before training", "–"]


def cache_sample(folder, i, ids, layers, hidden):
    states = torch.randn(len(ids), layers, hidden, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
    save_file({"token_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": states},
              str(folder / f"hs_{i}.safetensors"))


def test_keep_the_cache_is_refused_while_rows_are_missing_then_becomes_the_runs_extraction(
        online_run, tmp_path, user, django_capture_on_commit_callbacks):
    from workers.orchestration.online_tasks import keep_cache_task

    prepared = tmp_path / "prepared"
    Dataset.from_dict({"input_ids": ROWS, "loss_mask": [[1] * len(r) for r in ROWS]}).save_to_disk(str(prepared))
    Preparation.objects.filter(run=online_run).update(status=StageStatus.SUCCEEDED, out_dir=str(prepared),
                                                      num_rows=len(ROWS))
    record_training(online_run, tmp_path, supply_report())
    online_run.refresh_from_db()
    layers, hidden = len(online_run.extract_stage.layer_ids), online_run.target.hidden_size
    cache = Path(online_run.output_dir) / "hidden_states_cache"
    cache.mkdir(parents=True)
    cache_sample(cache, 0, ROWS[0], layers, hidden)
    run = selectors.run_get(pk=online_run.pk)
    with pytest.raises(RunConfigError, match="the cache holds 1 of 3 prepared rows: 2 missing"):
        online_services.online_keep_request(run=run, user=user)
    assert summary_of(online_run)["supply"]["keep"]["status"] is None  # nothing stored

    for i in (1, 2):
        cache_sample(cache, i, ROWS[i], layers, hidden)
    with django_capture_on_commit_callbacks(execute=False) as sent:
        online_services.online_keep_request(run=selectors.run_get(pk=online_run.pk), user=user)
    assert len(sent) >= 1 and summary_of(online_run)["supply"]["keep"]["status"] == "queued"
    assert keep_cache_task(online_run.pk) is True  # what the worker that took the message runs

    keep = summary_of(online_run)["supply"]["keep"]
    extraction = Extraction.objects.get(produced_by__run=online_run)
    assert (keep["status"], keep["extraction_id"], keep["offered"]) == ("succeeded", extraction.pk, False)
    assert (extraction.num_samples, extraction.total_tokens, extraction.layer_ids) == (
        3, 13, online_run.extract_stage.layer_ids)
    assert extraction.verifications.latest("pk").passed
    with pytest.raises(RunConfigError, match="succeeded already"):
        online_services.online_keep_request(run=selectors.run_get(pk=online_run.pk), user=user)
