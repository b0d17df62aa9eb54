"""Evaluation suites (runs.data.suites, runs.pipeline.best): a run names the prompt sets every checkpoint is
measured on besides its held-out prompts, and its best is chosen by one of them or by a weighted mix.

The evaluate stage is played as a worker plays it (as in test_best_by_tau.py): every checkpoint measured on
each suite (measured_alongside_record with the suite's file), the others on the held-out prompts, then the
stage's own row. Three checkpoints whose τ disagree by suite:
    held_out: epoch 0 2.00, epoch 1 2.30, epoch 2 2.41  -> epoch 2
    code:     epoch 0 2.60, epoch 1 2.50, epoch 2 1.90  -> epoch 0
    0.5 held_out + 0.5 code: 2.30, 2.40, 2.155           -> epoch 1"""
from __future__ import annotations

import dataclasses

import pytest
from django.core.management import CommandError, call_command

from runs.models import Checkpoint, EvalSuite, Evaluation, PipelineRun
from runs.pipeline.lifecycle.result_records import evaluation_record, measured_alongside_record
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.lifecycle.stage_services import stage_start
from tests.services.checkpoints.test_best_by_tau import TAUS, _launch, _result, _summary, _trained

pytestmark = pytest.mark.django_db

CODE = {0: 2.60, 1: 2.50, 2: 1.90}
CHAT = '{"messages": [{"role": "user", "content": "def f(x):"}, {"role": "assistant", "content": "return x"}]}\n'


@pytest.fixture
def code_file(roots):
    path = roots / "suites" / "code.jsonl"
    path.parent.mkdir()
    path.write_text(CHAT)
    return path


def _evaluated(run, checkpoints, suites: dict[str, dict[int, float]]) -> None:
    marked = next(c for c in checkpoints.values() if c.is_best)
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=marked)
    stage = Evaluation.objects.get(pk=run.evaluation.pk)
    for name, taus in suites.items():
        for epoch, checkpoint in checkpoints.items():
            result = dataclasses.replace(_result(checkpoint, taus[epoch]), prompt_source=f"suite {name}")
            measured_alongside_record(measured=stage, checkpoint_id=checkpoint.pk, result=result,
                                      prompts_path=run.config["eval_suites"][name], suite=name)
    for epoch, checkpoint in checkpoints.items():
        if checkpoint != marked:
            measured_alongside_record(measured=stage, checkpoint_id=checkpoint.pk, result=_result(checkpoint, TAUS[epoch]))
    started = stage_start(stage_name="evaluate", record_id=stage.pk, worker="test").started_at
    evaluation_record(record_id=stage.pk, result=_result(marked, TAUS[marked.epoch]), log_tail="", started_at=started)


def _best_epoch(user, roots, code_file, **config) -> tuple[int, dict]:
    run = _launch(user, roots, eval_suites={"code": str(code_file)}, **config)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints, {"code": CODE})
    summary = _summary(run)
    return summary["best"]["epoch"], summary


def test_best_by_a_suite_picks_otherwise_than_best_by_the_held_out_prompts(user, roots, code_file):
    by_held_out, summary = _best_epoch(user, roots, code_file)
    assert by_held_out == 2
    by_code, summary = _best_epoch(user, roots, code_file, best_suite="code")
    assert by_code == 0
    assert summary["best"]["on"] == "code" and summary["best"]["chosen_tau"] == 2.60
    assert summary["best"]["text"].startswith("best by τ on code: epoch 1 (τ 2.60 on code; held-out τ 2.00)")
    assert "by held-out τ alone: epoch 3" in summary["best"]["text"]
    marked = [c["epoch"] for c in summary["checkpoints"] if c["is_best"]]
    assert marked == [0]


def test_a_weighted_mix_picks_the_checkpoint_best_on_both(user, roots, code_file):
    epoch, summary = _best_epoch(user, roots, code_file, best_suite_weights={"held_out": 0.5, "code": 0.5})
    assert epoch == 1 and summary["best"]["chosen_tau"] == pytest.approx(2.40)


def test_the_summary_carries_each_checkpoints_tau_by_suite(user, roots, code_file):
    _, summary = _best_epoch(user, roots, code_file)
    assert {c["epoch"]: c["tau_by_suite"] for c in summary["checkpoints"]} == {
        e: {"held_out": TAUS[e], "code": CODE[e]} for e in (0, 1, 2)}


def test_a_suite_is_registered_once_and_named_again_by_name_alone(user, roots, code_file):
    run = _launch(user, roots, eval_suites={"code": str(code_file)})
    suite = EvalSuite.objects.get(name="code")
    assert suite.path == str(code_file.resolve()) and suite.created_by == user
    again = _launch(user, roots, eval_suites={"code": ""})
    assert again.config["eval_suites"] == {"code": str(code_file.resolve())} == run.config["eval_suites"]


@pytest.mark.parametrize("config, field, words", [
    ({"eval_suites": {"code": ""}}, "eval_suites", "unknown suite"),
    ({"eval_suites": {"code": "/etc/passwd"}}, "eval_suites", "eval_suites[code]"),
    ({"eval_suites": {"code": "EMPTY"}}, "eval_suites", "empty"),
    ({"eval_suites": {"code": "CODE"}, "best_suite": "math"}, "best_suite", "'math' is not one of the run's suites"),
    ({"eval_suites": {"code": "CODE"}, "best_suite_weights": {"held_out": 0.5, "code": 0.4}},
     "best_suite_weights", "must sum to 1, got 0.9"),
    ({"eval_suites": {"code": "CODE"}, "best_suite_weights": {"held_out": 0.5, "math": 0.5}},
     "best_suite_weights", "names 'math'"),
    ({"eval_suites": {"code": "CODE"}, "best_suite_weights": {"held_out": 1.5, "code": -0.5}},
     "best_suite_weights", "at least 0"),
    ({"eval_suites": {"held_out": "CODE"}}, "eval_suites", "always measured"),
    ({"eval_suites": {"Code Suite": "CODE"}}, "eval_suites", "lowercase"),
    ({"eval_suites": {"code": "CODE"}, "best_suite": "code", "best_by": "val_loss"}, "best_suite", "best_by tau"),
])
def test_bad_suites_are_refused_naming_the_field_and_nothing_is_stored(user, roots, code_file, config, field, words):
    (roots / "empty.jsonl").write_text("")
    files = {"CODE": str(code_file), "EMPTY": str(roots / "empty.jsonl")}
    config = {**config, "eval_suites": {n: files.get(p, p) for n, p in config["eval_suites"].items()}}
    runs, suites = PipelineRun.objects.count(), EvalSuite.objects.count()
    with pytest.raises(RunConfigError, match=words.replace("[", r"\[").replace("]", r"\]")) as refused:
        _launch(user, roots, **config)
    assert refused.value.field == field
    assert (PipelineRun.objects.count(), EvalSuite.objects.count()) == (runs, suites)


def test_a_registered_name_with_another_path_is_refused(user, roots, code_file):
    _launch(user, roots, eval_suites={"code": str(code_file)})
    other = roots / "other.jsonl"
    other.write_text(CHAT)
    with pytest.raises(RunConfigError, match="registered as") as refused:
        _launch(user, roots, eval_suites={"code": str(other)})
    assert refused.value.field == "eval_suites"


def test_run_pipeline_takes_eval_suite_flags_and_names_the_flag_when_refused(user, roots, code_file, capsys):
    base = ["--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"), "--draft-vocab-size", "64",
            "--json"]
    with pytest.raises(CommandError, match="--best-suite-weight: best_suite_weights must sum to 1"):
        call_command("run_pipeline", *base, "--eval-suite", f"code={code_file}", "--best-suite-weight", "code=0.7")
    assert not EvalSuite.objects.exists()
    call_command("run_pipeline", *base, "--eval-suite", f"code={code_file}", "--best-suite", "code")
    run = PipelineRun.objects.get()
    assert run.config["eval_suites"] == {"code": str(code_file.resolve())} and run.config["best_suite"] == "code"


def test_the_run_page_shows_each_checkpoints_tau_on_the_suite(user, roots, code_file, client):
    run = _launch(user, roots, eval_suites={"code": str(code_file)}, best_suite="code")
    _evaluated(run, _trained(run), {"code": CODE})
    client.force_login(user)
    page = client.get(run.get_absolute_url()).content.decode()
    assert [f'data-suite="code" title="τ on the evaluation suite code">code {CODE[e]:.2f}</span>' in page
            for e in (0, 1, 2)] == [True] * 3
    assert "best by τ on code: epoch 1" in page


def test_compare_shows_the_k_each_suite_recommends_beside_the_held_out_k_to_serve(user, roots, code_file, client):
    """Compare's "k to serve" is the held-out measurement's recommended k only; under each suite's τ, the k that
    suite's own measurement recommends (here held_out 3, code 2), and none where the k table was not measured."""
    from runs.tracking.comparison import suites_side_by_side

    run = _launch(user, roots, eval_suites={"code": str(code_file)})
    checkpoints = _trained(run)
    _evaluated(run, checkpoints, {"code": CODE})
    best = Checkpoint.objects.get(training_run__run=run, is_best=True)  # by τ on held_out: epoch 2
    assert best.epoch == 2
    Evaluation.objects.filter(checkpoint=best, suite="").update(recommended_k=3)
    Evaluation.objects.filter(checkpoint=best, suite="code").update(recommended_k=2)
    run = PipelineRun.objects.get(pk=run.pk)
    row, = suites_side_by_side([run])["rows"]
    assert row["recommended_k"] == 3
    assert [(c["suite"], c["tau"], c["k"]) for c in row["cells"]] == [("held_out", 2.41, 3), ("code", CODE[2], 2)]
    client.force_login(user)
    other = _launch(user, roots)  # compare takes two runs at least; this one is not measured yet
    page = client.get(f"/runs/compare/?ids={run.pk},{other.pk}").content.decode()
    assert '<span class="hint suite-k" data-k="2">k 2</span>' in page and "held-out prompts only" in page
    Evaluation.objects.filter(checkpoint=best, suite="code").update(recommended_k=None)
    row, = suites_side_by_side([PipelineRun.objects.get(pk=run.pk)])["rows"]
    assert [c["k"] for c in row["cells"]] == [3, None]


def test_suites_are_set_the_same_through_the_form_and_the_api_and_refused_naming_the_field(client, user, roots,
                                                                                           code_file):
    from runs.api import tokens
    from tests.api.conftest import ApiClient

    api = ApiClient(tokens.token_create(user=user, name="tests")[1])
    base = {"target": str(roots / "target"), "dataset": str(roots / "chats.jsonl"), "draft_vocab_size": 64}
    refused = api.post("/api/v1/runs/", {**base, "eval_suites": {"code": str(code_file)},
                                         "best_suite_weights": {"held_out": 0.5, "code": 0.6}})
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["best_suite_weights"], refused.content
    outside = api.post("/api/v1/runs/", {**base, "eval_suites": {"code": "/etc/hostname"}})
    assert outside.status_code == 400 and list(outside.json()["fields"]) == ["eval_suites"], outside.content
    assert not PipelineRun.objects.exists() and not EvalSuite.objects.exists()
    made = api.post("/api/v1/runs/", {**base, "eval_suites": {"code": str(code_file)},
                                      "best_suite_weights": {"held_out": 0.5, "code": 0.5}})
    assert made.status_code == 201, made.content
    assert made.json()["config"]["best_suite_weights"] == {"held_out": 0.5, "code": 0.5}
    client.force_login(user)
    form = {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "max_seq_len": 512,
            "draft_vocab_size": 64, "epochs": 1, "lr": 3e-4, "ttt_steps": 1}
    page = client.post("/runs/new/", {**form, "eval_suites": "code", "best_suite": "math"})
    assert page.status_code == 400 and "&#x27;math&#x27; is not one of the run&#x27;s suites" in page.content.decode()
    assert client.post("/runs/new/", {**form, "eval_suites": "code", "best_suite": "code"}).status_code == 302
    assert PipelineRun.objects.order_by("-id").first().config["eval_suites"] == {"code": str(code_file.resolve())}


def test_the_serve_k_and_the_card_read_the_held_out_k_and_every_suites_tau(user, roots, code_file, tmp_path):
    """The code suite is measured after the held-out prompts and recommends another k (2 against 3): the k
    every request is served with, in the summary, the serve command and the card, stays the held-out
    measurement's; the card states τ on each suite as the database holds it."""
    from runs.checkpoints.card_facts import checkpoint_card_facts
    from tests.services.checkpoints.test_best_by_tau import _summary

    run = _launch(user, roots, eval_suites={"code": str(code_file)})
    _evaluated(run, _trained(run), {"code": CODE})
    best = Checkpoint.objects.get(training_run__run=run, is_best=True)
    stage = Evaluation.objects.get(pk=run.evaluation.pk)  # the code suite measured again, last (as live τ may)
    measured_alongside_record(measured=stage, checkpoint_id=best.pk, prompts_path=str(code_file), suite="code",
                              result=dataclasses.replace(_result(best, CODE[2]), prompt_source="suite code"))
    held_out = Evaluation.objects.filter(checkpoint=best, suite="").order_by("-id").first()
    code = Evaluation.objects.filter(checkpoint=best, suite="code").order_by("-id").first()
    assert held_out.pk < code.pk  # the suite's measurement is the newest
    Evaluation.objects.filter(pk=held_out.pk).update(recommended_k=3, k_table={"rows": {"3": {"tau": 2.41}}})
    Evaluation.objects.filter(pk=code.pk).update(recommended_k=2, k_table={"rows": {"2": {"tau": 1.8}}})
    row = next(c for c in _summary(PipelineRun.objects.get(pk=run.pk))["checkpoints"] if c["id"] == best.pk)
    assert (row["recommended_k"], row["tau_by_k"]) == (3, {3: 2.41})
    facts = checkpoint_card_facts(checkpoint=Checkpoint.objects.get(pk=best.pk), out_dir=tmp_path / "export")
    assert (facts["recommended_k"], facts["tau_by_k"]) == (3, {"3": 2.41})
    assert facts["tau_by_suite"] == {"held_out": TAUS[2], "code": CODE[2]}
    assert facts["serve_command"].endswith('"method": "eagle3", "num_speculative_tokens": 3}\'')
