"""What a stage dropped or cut shows on the run page and in the summary, not only in the log."""
import json

import pytest

from runs.pipeline import selectors, services
from runs.pipeline.status.run_summary import run_summary
from runs.models import Evaluation, Preparation, StageStatus, TrainingRun
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(tmp_path, settings, user, django_capture_on_commit_callbacks):
    data = tmp_path / "data"
    (data / "target").mkdir(parents=True)
    settings.EAGLE3WEB_DATA_ROOTS = [data.resolve()]
    (data / "target" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64,
        "vocab_size": 5000}))
    (data / "chats.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    with django_capture_on_commit_callbacks(execute=False):
        return services.run_launch(user=user, target_path=data / "target", dataset_path=data / "chats.jsonl",
                                   config=RunConfig(max_seq_len=512))


def test_a_clean_run_shows_no_warning(run, client, user):
    Preparation.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, num_excluded=0, num_turns_dropped=0,
                                               num_truncated_rows=0, truncated_loss_tokens=0, num_without_assistant=0)
    summary = run_summary(selectors.run_list().get(pk=run.pk))
    assert all(stage["warnings"] == [] for stage in summary["stages"])


def test_truncated_rows_and_untrained_tokens_are_warnings_on_the_page_and_in_the_summary(run, client, user):
    Preparation.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, num_excluded=2, num_turns_dropped=1,
                                               num_truncated_rows=3, truncated_loss_tokens=41, num_without_assistant=0)
    TrainingRun.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, loss_tokens_available=1000,
                                               loss_tokens_trained=900, split={"by": "row", "seed": 0})
    Evaluation.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, tau=1.5, output_matches_greedy=False,
                                              mismatched_prompts=[4])
    summary = run_summary(selectors.run_list().get(pk=run.pk))
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["prepare"]["warnings"] == [
        "2 conversation(s) excluded by curation",
        "1 assistant turn(s) dropped: their context alone reaches max_seq_len=512, or the chat template renders "
        "them unstably",
        "3 row(s) cut at max_seq_len=512: 41 supervised token(s) lost",
    ]
    assert stages["prepare"]["num_truncated_rows"] == 3 and stages["prepare"]["truncated_loss_tokens"] == 41
    assert stages["train"]["loss_tokens_available"] == 1000 and stages["train"]["loss_tokens_trained"] == 900
    assert stages["train"]["warnings"][0] == ("100 of 1,000 supervised tokens of the train split never reached "
                                              "the loss in the last epoch")
    assert "validation split by row" in stages["train"]["warnings"][1]
    assert "changed the decoded text on 1 prompt(s)" in stages["evaluate"]["warnings"][0]

    client.login(username=user.username, password=user.raw_password)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "3 warnings" in page and "3 row(s) cut at max_seq_len=512: 41 supervised token(s) lost" in page
    assert "100 of 1,000 supervised tokens" in page
    api = client.get(f"/api/v1/runs/{run.pk}/status/").json()
    assert api["stages"][0]["warnings"] == stages["prepare"]["warnings"]


def test_a_resumed_training_says_from_which_step(run, client, user):
    TrainingRun.objects.filter(run=run).update(status=StageStatus.SUCCEEDED, resumed_from_step=1200)
    summary = run_summary(selectors.run_list().get(pk=run.pk))
    train = next(s for s in summary["stages"] if s["name"] == "train")
    assert train["resumed_from_step"] == 1200
    assert train["warnings"] == ["resumed from step 1,200 after a lost or cancelled attempt: the curve and "
                                 "checkpoints before it are the earlier attempt's"]


def test_how_a_training_ran_and_where_its_time_went_reach_the_page_and_the_summary(run, client, user, tmp_path):
    """Through the service that records a real TrainResult, as the train task does."""
    from runs.pipeline.lifecycle.result_records import training_record
    from workers.stages.train.results import TrainResult
    from workers.stages.train.holdout.split import SplitInfo

    training = TrainingRun.objects.get(run=run)
    TrainingRun.objects.filter(pk=training.pk).update(status=StageStatus.RUNNING)
    split = SplitInfo(by="conversation", seed=0, train_rows=9, val_rows=1, train_conversations=9,
                      val_conversations=1, val_fraction=0.1)
    result = TrainResult(out_dir=tmp_path, checkpoints=[], best_epoch=0, steps=12, train_tokens=98_304,
                         tokens_per_second=90_014.6, seconds=72.2, tokens_per_step=8192, loss_tokens_available=10,
                         loss_tokens_trained=10, loss_tokens_per_epoch=[10], rows_unusable=0, split=split,
                         device="cuda:0 (NVIDIA H200)", step_config="attention flex, loss fused, compute bfloat16",
                         time_split_s={"data": 0.09, "copies": 0.03, "forward": 25.63, "backward": 14.0,
                                       "optimizer": 0.13})
    training_record(record_id=training.pk, result=result, log_tail="")
    summary = run_summary(selectors.run_list().get(pk=run.pk))
    train = next(s for s in summary["stages"] if s["name"] == "train")
    assert train["step_config"] == "attention flex, loss fused, compute bfloat16"
    assert train["time_split_s"]["forward"] == 25.63
    client.login(username=user.username, password=user.raw_password)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "attention flex, loss fused, compute bfloat16" in page
    assert "forward 25.6 s · backward 14.0 s · optimizer 0.1 s" in page
