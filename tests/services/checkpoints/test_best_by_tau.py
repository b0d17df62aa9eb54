"""A run's best checkpoint (runs.pipeline.best): the highest τ its evaluate stage measured, the lower
validation loss on a tie, chosen by our τ alone (measured on every checkpoint) with vLLM's shown beside it
and a note where the two disagree beyond the prompts' noise; the lowest validation loss when the run asks
for it (`best_by`), which the form, the API and run_pipeline refuse naming the field when bad.

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
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.lifecycle.result_records import evaluation_record, measured_alongside_record, serve_check_record
from runs.pipeline.lifecycle.stage_services import stage_start
from runs.web.forms import LaunchForm
from tests.api.conftest import ApiClient
from tests.helpers.fleet import fake_gpu_worker

pytestmark = pytest.mark.django_db

LOSSES = {0: 2.0, 1: 1.5, 2: 1.7}  # epoch 1: the lowest validation loss
TAUS = {0: 2.0, 1: 2.30, 2: 2.41}  # epoch 2: the highest τ
# τ's standard error over the prompts of every measurement here: the prompts' noise is 2 × 0.04 = 0.08.
STANDARD_ERROR = 0.04


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


def _result(checkpoint: Checkpoint, tau: float, *, max_new_tokens: int = 64, k: int = 3,
            standard_error: float | None = STANDARD_ERROR):
    from workers.stages.evaluate.measure import EvaluationResult

    return _made(
        EvaluationResult, checkpoint_dir=Path(checkpoint.path), target_dir=Path("/target"), num_speculative_tokens=k,
        max_new_tokens=max_new_tokens, num_prompts=4, prompt_source="validation conversations", tau=tau,
        tau_standard_error=standard_error,
        acceptance_per_position=[0.5, 0.3, 0.2], new_tokens=256, verify_forwards=100, output_matches_greedy=True,
        mismatched_prompts=[], spec_seconds=1.0, greedy_seconds=2.0, spec_tokens_per_s=256.0,
        greedy_tokens_per_s=128.0, speedup=2.0, device="cpu", seconds=3.0)


def _evaluated(run, checkpoints: dict[int, Checkpoint], taus=TAUS,
               standard_error: float | None = STANDARD_ERROR) -> None:
    """The evaluate stage: every other checkpoint first, then its own row, of the trainer's mark."""
    marked = next(c for c in checkpoints.values() if c.is_best)
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=marked)
    stage = Evaluation.objects.get(pk=run.evaluation.pk)
    for epoch, checkpoint in checkpoints.items():
        if checkpoint == marked:
            continue
        result = _result(checkpoint, taus[epoch], standard_error=standard_error)
        measured_alongside_record(measured=stage, checkpoint_id=checkpoint.pk, result=result)
    started = stage_start(stage_name="evaluate", record_id=run.evaluation.pk, worker="test").started_at
    evaluation_record(record_id=run.evaluation.pk, result=_result(marked, taus[marked.epoch],
                                                                  standard_error=standard_error), log_tail="",
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
    return run_summary(selectors.run_list().get(pk=run.pk))


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
    assert run_summary(selectors.run_list().get(pk=run.pk))["best"]["epoch"] == 2


def _serve_checked_run(user, roots, standard_error: float | None = STANDARD_ERROR):
    """A run that asked for a serve check, its checkpoints measured (epoch 2 the best by our τ, 2.41), the
    check it asked for done, vLLM accepting less of epoch 2 than our decoding did: 2.20, below the unserved
    epoch 1's 2.30 by ours."""
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=1)  # FAKE: a vLLM host, so the run may ask for a check
    run = _launch(user, roots, serve_check=True)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints, standard_error=standard_error)
    # The run's check serves its best by τ (epoch 2), with the run's measurement's prompts and settings.
    check = ServeCheck.objects.get()
    assert (check.checkpoint, check.evaluation_id) == (checkpoints[2], run.evaluation.pk)
    _served(check, vllm_tau=2.20)
    check.refresh_from_db()
    assert check.tau == pytest.approx(2.41) and check.tau_difference == pytest.approx(2.20 - 2.41)  # ours: epoch 2's
    return run, checkpoints


NOTE = ("vLLM's τ for the best, 2.20, differs from ours, 2.41, by -0.21: more than the prompts' noise (±0.08, "
        "2 standard errors of our τ over its 4 prompts). The best was chosen by our τ, measured on every checkpoint; "
        "served by vLLM the checkpoints may rank otherwise: serve-check the others from their pages before relying "
        "on the choice.")


def test_the_best_is_chosen_by_our_tau_alone_and_vllms_disagreement_is_said_on_the_page_and_api(
        user, roots, client, django_capture_on_commit_callbacks):
    # Chosen across the two measures, the served epoch 2 (vLLM's 2.20) lost to the unserved epoch 1 (our 2.30).
    with django_capture_on_commit_callbacks(execute=True):
        run, checkpoints = _serve_checked_run(user, roots)
    assert _best_epoch(run) == 2
    assert type(run.training_run).objects.get(pk=run.training_run.pk).best_tau == 2.41  # ours, what lists sort by
    summary = _summary(run)
    by_epoch = {c["epoch"]: c for c in summary["checkpoints"]}
    assert (by_epoch[2]["tau"], by_epoch[2]["vllm_tau"], by_epoch[2]["tau_for_best"]) == (2.41, 2.20, 2.41)
    assert by_epoch[1]["vllm_tau"] is None and by_epoch[1]["tau_for_best"] == 2.30
    best = summary["best"]
    assert (best["epoch"], best["tau"], best["vllm_tau"], best["tau_standard_error"]) == (2, 2.41, 2.20, 0.04)
    assert best["noise"] == pytest.approx(0.08) and best["vllm_disagrees"] is True
    assert best["text"] == "best by τ: epoch 3 (τ 2.41; vLLM 2.20); lowest validation loss: epoch 2 (τ 2.30)."
    assert best["vllm_note"] == NOTE
    client.force_login(user)
    page = client.get(run.get_absolute_url()).content.decode()
    assert f'<p id="best-vllm-note" class="field-error">{NOTE.replace(chr(39), "&#x27;")}</p>' in page
    api = ApiClient(tokens.token_create(user=user, name="tests")[1])
    status = api.get(f"/api/v1/runs/{run.pk}/status/").json()
    assert status["best"]["vllm_note"] == NOTE and status["best"]["vllm_disagrees"] is True


def test_vllms_tau_within_the_prompts_noise_of_ours_is_no_disagreement(user, roots, client):
    # The same figures, measured on prompts that spread τ more: a standard error of 0.15 makes the noise ±0.30.
    run, _ = _serve_checked_run(user, roots, standard_error=0.15)
    best = _summary(run)["best"]
    assert (best["epoch"], best["vllm_tau"], best["vllm_disagrees"], best["vllm_note"]) == (2, 2.20, False, "")
    client.force_login(user)
    assert '<p id="best-vllm-note" class="field-error" hidden></p>' in client.get(run.get_absolute_url()).content.decode()


def test_without_a_standard_error_a_disagreement_is_not_claimed(user, roots):
    run, _ = _serve_checked_run(user, roots, standard_error=None)  # measured before the error was kept
    best = _summary(run)["best"]
    assert (best["vllm_tau"], best["noise"], best["vllm_disagrees"], best["vllm_note"]) == (2.20, None, None, "")


def test_vllms_tau_of_another_checkpoint_moves_nothing(user, roots):
    run = _launch(user, roots)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints)
    assert _best_epoch(run) == 2
    from runs.checkpoints.serve_check_services import serve_check_request

    check, _ = serve_check_request(checkpoint=checkpoints[1], user=user, enqueue=False)
    _served(check, vllm_tau=2.60)  # above the best's 2.41 by ours, but only epoch 1 was served
    assert _best_epoch(run) == 2
    best = _summary(run)["best"]
    assert (best["tau"], best["vllm_tau"]) == (2.41, None)
    assert best["text"] == "best by τ: epoch 3 (τ 2.41); lowest validation loss: epoch 2 (τ 2.30; vLLM 2.60)."


def test_a_later_measurement_that_moves_the_best_gets_the_new_best_serve_checked(user, roots):
    run, checkpoints = _serve_checked_run(user, roots)
    # Epoch 1 measured again as the evaluate stage measures (its prompts and settings): 2.50 now, the best by ours.
    again = Evaluation.objects.create(checkpoint=checkpoints[1], max_new_tokens=64, num_speculative_tokens=3)
    started = stage_start(stage_name="evaluate", record_id=again.pk, worker="test").started_at
    evaluation_record(record_id=again.pk, result=_result(checkpoints[1], 2.50), log_tail="", started_at=started)
    assert _best_epoch(run) == 1
    checks = list(ServeCheck.objects.order_by("id").values_list("checkpoint__epoch", "evaluation_id", "status"))
    assert checks == [(2, run.evaluation.pk, "succeeded"), (1, run.evaluation.pk, "queued")]


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
    # The words a reader sees; the summary the page carries for its polls names a "provisional": false key.
    assert "(provisional)" not in page
    assert 'id="plot-loss-tau"' in page and "js/runs/loss_tau.js" in page
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
    from workers.stages.train.results import lowest_val_loss_epoch

    assert lowest_val_loss_epoch({0: math.nan, 1: 2.0, 2: 1.9}) == 2
    assert lowest_val_loss_epoch({0: 1.9, 1: 1.9, 2: 2.0}) == 0
    assert lowest_val_loss_epoch({0: math.nan, 1: math.inf}) == 0  # nothing validated: the first, as before
