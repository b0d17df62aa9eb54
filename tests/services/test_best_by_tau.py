"""A run's best checkpoint (runs.pipeline.best): the highest τ its evaluate stage measured, the lower
validation loss on a tie, vLLM's τ over ours where a serve check ran; the lowest validation loss when the
run asks for it (`best_by`), which the form, the API and run_pipeline refuse naming the field when bad.

Each run here has three checkpoints whose losses and τ disagree: epoch 1 has the lowest validation loss
(the trainer's mark), epoch 2 the highest τ. The evaluate stage is played as a worker plays it: the
checkpoints other than the trainer's get their own measurement (measured_alongside_record), then the
stage records its own row, of the trainer's mark (evaluation_record)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from runs.api import tokens
from runs.models import Checkpoint, Evaluation, PipelineRun, ServeCheck, StageStatus
from runs.pipeline import selectors, services
from runs.pipeline.run_config import RunConfig, RunConfigError
from runs.pipeline.result_records import evaluation_record, measured_alongside_record, serve_check_record
from runs.pipeline.stage_services import stage_start
from runs.web.forms import LaunchForm
from tests.api.conftest import ApiClient
from tests.fleet import fake_gpu_worker

pytestmark = pytest.mark.django_db

LOSSES = {0: 2.0, 1: 1.5, 2: 1.7}  # epoch 1: the lowest validation loss
TAUS = {0: 2.0, 1: 2.30, 2: 2.41}  # epoch 2: the highest τ


def _launch(user, roots, **config) -> PipelineRun:
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config), enqueue=False)


def _trained(run, losses=LOSSES, trainers_best: int = 1) -> dict[int, Checkpoint]:
    """The checkpoints as the train stage registers them, the trainer's mark on `trainers_best`."""
    checkpoints = {e: Checkpoint.objects.create(training_run=run.training_run, epoch=e, val_loss=loss,
                                                path=f"{run.output_dir}/checkpoints/{e}", is_best=e == trainers_best)
                   for e, loss in losses.items()}
    type(run.training_run).objects.filter(pk=run.training_run.pk).update(best_epoch=trainers_best, status="succeeded")
    return checkpoints


def _result(checkpoint: Checkpoint, tau: float, *, max_new_tokens: int = 64, k: int = 3):
    from workers.stages.evaluate.measure import EvaluationResult

    return _made(
        EvaluationResult, checkpoint_dir=Path(checkpoint.path), target_dir=Path("/target"), num_speculative_tokens=k,
        max_new_tokens=max_new_tokens, num_prompts=4, prompt_source="validation conversations", tau=tau,
        acceptance_per_position=[0.5, 0.3, 0.2], new_tokens=256, verify_forwards=100, output_matches_greedy=True,
        mismatched_prompts=[], spec_seconds=1.0, greedy_seconds=2.0, spec_tokens_per_s=256.0,
        greedy_tokens_per_s=128.0, speedup=2.0, device="cpu", seconds=3.0)


def _evaluated(run, checkpoints: dict[int, Checkpoint], taus=TAUS) -> None:
    """The evaluate stage: every other checkpoint first, then its own row, of the trainer's mark."""
    marked = next(c for c in checkpoints.values() if c.is_best)
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=marked)
    stage = Evaluation.objects.get(pk=run.evaluation.pk)
    for epoch, checkpoint in checkpoints.items():
        if checkpoint == marked:
            continue
        result = _result(checkpoint, taus[epoch])
        measured_alongside_record(measured=stage, checkpoint_id=checkpoint.pk, result=result)
    started = stage_start(stage_name="evaluate", record_id=run.evaluation.pk, worker="test").started_at
    evaluation_record(record_id=run.evaluation.pk, result=_result(marked, taus[marked.epoch]), log_tail="",
                      started_at=started)


def _made(cls, **values):
    """A result dataclass with `values`; any other field without a default zero, empty or None (what this
    file checks does not read them, and the results gain fields of their own)."""
    blank = {"int": 0, "float": 0.0, "str": "", "bool": False}
    for f in dataclasses.fields(cls):
        if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kind = str(f.type)
            values[f.name] = None if "None" in kind else [] if kind.startswith("list") else blank.get(kind)
    return cls(**values)


def _served(check: ServeCheck, vllm_tau: float) -> None:
    from workers.stages.evaluate.serve_check import ServeCheckResult

    result = _made(
        ServeCheckResult, checkpoint_dir=Path(check.checkpoint.path), target_dir=Path("/target"), num_prompts=4, max_new_tokens=64,
        num_speculative_tokens=3, dtype="float32", command="vllm serve ...", vllm_version="0.33.0", vllm_build="cpu",
        vllm_tau=vllm_tau, vllm_tau_emitted=vllm_tau, vllm_acceptance_per_position=[0.5, 0.3, 0.2], vllm_drafts=100,
        vllm_draft_tokens=300, vllm_accepted_tokens=120, vllm_output_matches_greedy=True, mismatched_prompts=[],
        vllm_new_tokens=256, vllm_tokens_per_s_with=200.0, vllm_tokens_per_s_without=100.0, vllm_speedup=2.0,
        startup_seconds=1.0, seconds=2.0)
    started = stage_start(stage_name="serve_check", record_id=check.pk, worker="test").started_at
    serve_check_record(record_id=check.pk, result=result, log_tail="", started_at=started)


def _best_epoch(run) -> int:
    marked = list(Checkpoint.objects.filter(training_run__run=run, is_best=True).values_list("epoch", flat=True))
    assert len(marked) == 1, marked
    assert type(run.training_run).objects.get(pk=run.training_run.pk).best_epoch == marked[0]
    return marked[0]


def _summary(run) -> dict:
    return selectors.run_summary(selectors.run_list().get(pk=run.pk))


def test_by_tau_the_higher_tau_wins_over_the_lower_loss_once_every_checkpoint_is_measured(user, roots):
    run = _launch(user, roots)
    assert run.config["best_by"] == "tau"
    checkpoints = _trained(run)
    before = _summary(run)
    assert before["best"]["provisional"] is True and before["best"]["epoch"] == 1 and _best_epoch(run) == 1
    assert "provisional" in before["best"]["text"]
    _evaluated(run, checkpoints)
    assert _best_epoch(run) == 2
    summary = _summary(run)
    assert (summary["best_by"], summary["best"]["epoch"], summary["best"]["provisional"]) == ("tau", 2, False)
    assert summary["best"]["text"] == "best by τ: epoch 3 (τ 2.41); lowest validation loss: epoch 2 (τ 2.30)."
    assert {c["epoch"]: c["tau"] for c in summary["checkpoints"]} == TAUS
    assert {c["epoch"]: c["tau_for_best"] for c in summary["checkpoints"]} == TAUS
    assert [c["epoch"] for c in summary["checkpoints"] if c["is_best"]] == [2]
    # The run's acceptance is its best's measurement now, not the stage's row (which measured epoch 1).
    assert summary["acceptance"]["checkpoint_id"] == checkpoints[2].pk and summary["acceptance"]["tau"] == 2.41
    assert summary["ids"]["evaluation"] == run.evaluation.pk


def test_by_val_loss_the_lower_loss_stays_best_and_is_never_provisional(user, roots):
    run = _launch(user, roots, best_by="val_loss")
    checkpoints = _trained(run)
    assert _summary(run)["best"]["provisional"] is False
    _evaluated(run, checkpoints)
    assert _best_epoch(run) == 1
    summary = _summary(run)
    assert (summary["best_by"], summary["best"]["epoch"]) == ("val_loss", 1)
    assert summary["best"]["by_tau"]["epoch"] == 2 and summary["best"]["differ"] is True
    assert summary["acceptance"]["checkpoint_id"] == checkpoints[1].pk


def test_a_tie_on_tau_goes_to_the_lower_validation_loss(user, roots):
    # Epochs 1 and 2 tie to 3 decimals, above epoch 0 (the lowest loss): epoch 2 has the lower loss of the two.
    run = _launch(user, roots)
    checkpoints = _trained(run, losses={0: 1.4, 1: 1.8, 2: 1.6}, trainers_best=0)
    _evaluated(run, checkpoints, taus={0: 2.0, 1: 2.5001, 2: 2.4998})
    assert _best_epoch(run) == 2
    # The same τ with the losses swapped: the other one.
    run = _launch(user, roots)
    checkpoints = _trained(run, losses={0: 1.4, 1: 1.6, 2: 1.8}, trainers_best=0)
    _evaluated(run, checkpoints, taus={0: 2.0, 1: 2.4998, 2: 2.5001})
    assert _best_epoch(run) == 1


def test_a_measurement_with_other_settings_does_not_choose(user, roots):
    run = _launch(user, roots)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints)
    # Someone measures epoch 0 with 256 new tokens: τ 3.5, but not comparable with the run's measurements.
    Evaluation.objects.create(checkpoint=checkpoints[0], status=StageStatus.SUCCEEDED, tau=3.5, max_new_tokens=256,
                              num_prompts=4, num_speculative_tokens=3)
    assert selectors.run_summary(selectors.run_list().get(pk=run.pk))["best"]["epoch"] == 2


def test_vllms_tau_from_the_serve_check_overrides_ours(user, roots):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=1)  # FAKE: a vLLM host, so the run may ask for a check
    run = _launch(user, roots, serve_check=True)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints)
    # The run's check serves its best by τ (epoch 2), with the run's measurement's prompts and settings.
    check = ServeCheck.objects.get()
    assert (check.checkpoint, check.evaluation_id) == (checkpoints[2], run.evaluation.pk)
    _served(check, vllm_tau=2.20)  # vLLM accepts less of epoch 2 than our decoding did
    check.refresh_from_db()
    assert check.tau == pytest.approx(2.41) and check.tau_difference == pytest.approx(2.20 - 2.41)  # ours: epoch 2's
    assert _best_epoch(run) == 1
    summary = _summary(run)
    by_epoch = {c["epoch"]: c for c in summary["checkpoints"]}
    assert (by_epoch[2]["tau"], by_epoch[2]["vllm_tau"], by_epoch[2]["tau_for_best"]) == (2.41, 2.20, 2.20)
    assert summary["best"]["text"] == "best by τ: epoch 2 (τ 2.30), also the lowest validation loss."


def test_vllms_tau_can_also_raise_a_checkpoint_to_best(user, roots):
    run = _launch(user, roots)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints)
    assert _best_epoch(run) == 2
    from runs.checkpoints.serve_check_services import serve_check_request

    check, _ = serve_check_request(checkpoint=checkpoints[1], user=user, enqueue=False)
    _served(check, vllm_tau=2.60)
    assert _best_epoch(run) == 1
    assert "best by τ: epoch 2 (τ 2.60, vLLM), also the lowest validation loss" in _summary(run)["best"]["text"]


def test_the_run_page_says_provisional_then_shows_both_choices_when_they_differ(
        client, user, roots, django_capture_on_commit_callbacks):
    run = _launch(user, roots)
    checkpoints = _trained(run)
    client.force_login(user)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "best (provisional)</span>" in page and "best so far (provisional): epoch 2 (validation loss 1.5000)" in page
    with django_capture_on_commit_callbacks(execute=True):  # the run's change counter moves, as on commit
        _evaluated(run, checkpoints)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "best by τ: epoch 3 (τ 2.41); lowest validation loss: epoch 2 (τ 2.30)." in page
    assert "provisional" not in page
    assert 'id="plot-loss-tau"' in page and "js/loss_tau.js" in page
    other = _launch(user, roots)
    compare = client.get(f"/runs/compare/?ids={run.pk},{other.pk}").content.decode()
    assert 'id="compare-loss-tau"' in compare and f'data-url="/api/v1/runs/{run.pk}/status/"' in compare


@pytest.mark.parametrize("bad", ["loss", "TAU", ""])
def test_a_bad_best_by_is_refused_naming_the_field(user, roots, bad):
    form = LaunchForm(data={"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"),
                            "max_seq_len": 512, "draft_vocab_size": 64, "epochs": 1, "lr": 3e-4, "ttt_steps": 1,
                            "best_by": bad})
    if bad:
        assert not form.is_valid() and list(form.errors) == ["best_by"]
    else:  # a browser's empty value: the default
        assert form.is_valid(), form.errors
        assert form.run_config().best_by == "tau"
        bad = None
    with pytest.raises(RunConfigError) as caught:
        RunConfig(best_by=bad)
    assert caught.value.field == "best_by" and "best_by must be one of tau, val_loss" in str(caught.value)
    with pytest.raises(CommandError, match="best_by must be one of tau, val_loss"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--best-by", str(bad), "--json")
    api = ApiClient(tokens.token_create(user=user, name="tests")[1])
    body = {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "best_by": bad or 5}
    response = api.post("/api/v1/runs/", body)
    assert response.status_code == 400 and list(response.json()["fields"]) == ["best_by"], response.content
    assert PipelineRun.objects.count() == 0


def test_best_by_is_set_the_same_through_the_form_the_api_and_the_command(client, user, roots):
    api = ApiClient(tokens.token_create(user=user, name="tests")[1])
    response = api.post("/api/v1/runs/", {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"),
                                          "best_by": "val_loss"})
    assert response.status_code == 201, response.content
    assert response.json()["config"]["best_by"] == "val_loss" and response.json()["best_by"] == "val_loss"
    client.force_login(user)
    assert client.post("/runs/new/", {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"),
                                      "max_seq_len": 512, "draft_vocab_size": 64, "epochs": 1, "lr": 3e-4,
                                      "ttt_steps": 1, "best_by": "val_loss"}).status_code == 302
    launch = client.get("/runs/new/").content.decode()
    assert 'name="best_by"' in launch and "lowest validation loss" in launch
    assert sorted(PipelineRun.objects.values_list("config__best_by", flat=True)) == ["val_loss", "val_loss"]


def test_the_trainers_mark_skips_a_diverged_validation_and_takes_the_earlier_epoch_on_a_tie():
    from workers.stages.train.loop import lowest_val_loss_epoch

    assert lowest_val_loss_epoch({0: math.nan, 1: 2.0, 2: 1.9}) == 2
    assert lowest_val_loss_epoch({0: 1.9, 1: 1.9, 2: 2.0}) == 0
    assert lowest_val_loss_epoch({0: math.nan, 1: math.inf}) == 0  # nothing validated: the first, as before
