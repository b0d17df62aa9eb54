"""τ while training (runs.pipeline.status.live_tau): which checkpoint a live measurement measures, and the rule
that stops training when τ is flat. The real workers: tests/e2e/fleet/test_live_tau.py."""
from __future__ import annotations

import json

import pytest

from runs.models import Checkpoint, Evaluation, StageStatus
from runs.pipeline import services
from runs.pipeline.status.live_tau import live_taus, tau_flat_reason
from runs.pipeline.lifecycle.result_records import checkpoints_register
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError


def test_tau_flat_waits_for_patience_plus_one_measurements_and_needs_no_gain():
    assert tau_flat_reason([(0, 1.5)], patience=1) == ""
    assert tau_flat_reason([(0, 1.5), (1, 1.6)], patience=1) == ""  # rose
    assert "did not beat τ 1.600 of epoch 2" in tau_flat_reason([(0, 1.5), (1, 1.6), (4, 1.6)], patience=1)
    assert tau_flat_reason([(0, 1.5), (1, 1.6), (2, 1.55), (3, 1.61)], patience=2) == ""  # the last beat 1.6
    reason = tau_flat_reason([(0, 1.5), (1, 1.6), (2, 1.55), (3, 1.6)], patience=2)
    assert reason.startswith("stopped early: τ stopped rising (stop_when_tau_flat=2)") and "epoch 4: 1.600" in reason


def test_stop_when_tau_flat_is_refused_out_of_range_or_with_speculators_trainer():
    with pytest.raises(RunConfigError, match="between 1 and 100") as bad:
        RunConfig(stop_when_tau_flat=0)
    assert bad.value.field == "stop_when_tau_flat"
    with pytest.raises(RunConfigError, match="needs training_backend eagle3web"):
        RunConfig(stop_when_tau_flat=2, training_backend="speculators")
    assert RunConfig(stop_when_tau_flat=2).measures_while_training and not RunConfig().measures_while_training


@pytest.mark.django_db
def test_a_saved_checkpoint_is_queued_and_takes_over_a_waiting_measurement(user, config_only_target, tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}) + "\n")
    run = services.run_launch(user=user, target_path=config_only_target, dataset_path=chats,
                              config=RunConfig(draft_vocab_size=64, live_tau=True, eval_prompts=5, eval_max_new_tokens=7))
    training_id = run.training_run.pk
    first, = checkpoints_register(training_run_id=training_id, checkpoints=[{"epoch": 0, "path": str(tmp_path / "0")}])
    live = Evaluation.objects.get(checkpoint__training_run_id=training_id)
    assert (live.checkpoint_id, live.status, live.max_prompts, live.max_new_tokens, live.run_id) == (
        first.pk, StageStatus.QUEUED, 5, 7, None)
    # Still waiting when the next is saved: the newest is measured instead, by the same row.
    second, = checkpoints_register(training_run_id=training_id, checkpoints=[{"epoch": 1, "path": str(tmp_path / "1")}])
    assert list(Evaluation.objects.filter(checkpoint__training_run_id=training_id).values_list("pk", "checkpoint_id")) == [
        (live.pk, second.pk)]
    # Once a worker took it, the next checkpoint gets a row of its own; registering the same epoch again does not.
    Evaluation.objects.filter(pk=live.pk).update(status=StageStatus.SUCCEEDED, tau=1.75)
    third, = checkpoints_register(training_run_id=training_id, checkpoints=[{"epoch": 2, "path": str(tmp_path / "2")}])
    checkpoints_register(training_run_id=training_id, checkpoints=[{"epoch": 2, "path": str(tmp_path / "2")}])
    assert sorted(Evaluation.objects.filter(checkpoint__training_run_id=training_id).values_list("checkpoint_id", "status")) == [
        (second.pk, StageStatus.SUCCEEDED), (third.pk, StageStatus.QUEUED)]
    assert live_taus(training_run_id=training_id) == [(1, 1.75)]


@pytest.mark.django_db
def test_a_run_without_live_tau_queues_nothing_when_a_checkpoint_is_saved(user, config_only_target, tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}) + "\n")
    run = services.run_launch(user=user, target_path=config_only_target, dataset_path=chats,
                              config=RunConfig(draft_vocab_size=64))
    checkpoints_register(training_run_id=run.training_run.pk, checkpoints=[{"epoch": 0, "path": str(tmp_path / "0")}])
    assert Checkpoint.objects.count() == 1 and not Evaluation.objects.filter(checkpoint__isnull=False).exists()


@pytest.mark.django_db
def test_live_tau_with_suites_queues_each_suite_and_stops_on_the_suite_that_chooses(user, config_only_target, tmp_path,
                                                                                   settings):
    """Live τ together with evaluation suites (issue 39): a saved checkpoint is queued on the held-out prompts and
    on each suite, each row taken over by the next checkpoint while it waits; the stop rule reads τ on best_suite
    alone (here "code": flat there while held_out still rises), and the summary shows τ per suite while training."""
    from runs.pipeline.status.live_tau import training_tau_flat
    from runs.pipeline import selectors
    from runs.pipeline.status.run_summary import run_summary

    settings.EAGLE3WEB_DATA_ROOTS = [tmp_path]
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}) + "\n")
    code = tmp_path / "code.jsonl"
    code.write_text(chats.read_text())
    run = services.run_launch(user=user, target_path=config_only_target, dataset_path=chats,
                              config=RunConfig(draft_vocab_size=64, stop_when_tau_flat=1, eval_prompts=5,
                                               eval_max_new_tokens=7, eval_suites={"code": str(code)}, best_suite="code"))
    training_id = run.training_run.pk
    rows = Evaluation.objects.filter(checkpoint__training_run_id=training_id)
    first, = checkpoints_register(training_run_id=training_id, checkpoints=[{"epoch": 0, "path": str(tmp_path / "0")}])
    assert sorted(rows.values_list("suite", "prompts_path", "checkpoint_id", "max_prompts", "status")) == [
        ("", "", first.pk, 5, StageStatus.QUEUED), ("code", str(code.resolve()), first.pk, 5, StageStatus.QUEUED)]
    second, = checkpoints_register(training_run_id=training_id, checkpoints=[{"epoch": 1, "path": str(tmp_path / "1")}])
    assert sorted(rows.values_list("suite", "checkpoint_id")) == [("", second.pk), ("code", second.pk)]
    # Measured: held_out 1.5 then 1.8 (rising), code 2.0 then 2.0 (flat); the suite chooses, so training stops.
    rows.filter(suite="").update(status=StageStatus.SUCCEEDED, tau=1.5, checkpoint=first)
    rows.filter(suite="code").update(status=StageStatus.SUCCEEDED, tau=2.0, checkpoint=first)
    for suite, tau in (("", 1.8), ("code", 2.0)):
        Evaluation.objects.create(checkpoint=second, suite=suite, prompts_path=str(code.resolve()) if suite else "",
                                  max_prompts=5, max_new_tokens=7, status=StageStatus.SUCCEEDED, tau=tau)
    assert live_taus(training_run_id=training_id) == [(0, 2.0), (1, 2.0)]
    reason = training_tau_flat(training_run_id=training_id, patience=1)
    assert reason.startswith("stopped early: τ stopped rising (stop_when_tau_flat=1)") and reason.endswith("τ on code")
    summary = run_summary(selectors.run_list().get(pk=run.pk))
    assert [(c["epoch"], c["tau"], c["tau_by_suite"]) for c in summary["checkpoints"]] == [
        (0, 1.5, {"held_out": 1.5, "code": 2.0}), (1, 1.8, {"held_out": 1.8, "code": 2.0})]
