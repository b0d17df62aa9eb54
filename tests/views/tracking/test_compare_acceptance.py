"""Compare's acceptance side by side (issue 26): a runs × draft positions table of each run's best
checkpoint's acceptance per position, as our evaluate stage measured it (runs.tracking.comparison.
acceptance_side_by_side), each cell's delta against a baseline run, blank past a run's k, a row that says
why where a run has no measurement; and compare costs the same queries for 3 runs and 10.

Run A (k=3) is the run of tests/services/checkpoints/test_best_by_tau.py: its evaluate stage's own row measured
epoch 1 (the trainer's mark, the lowest validation loss), and the best by τ moved to epoch 2. Run B's
draft proposes 2 tokens and its best is its stage row's epoch 1. Run C's evaluate stage has not run."""
from __future__ import annotations

import html

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import PipelineRun
from runs.pipeline import selectors
from runs.pipeline.status.run_summary import run_summary
from runs.tracking.comparison import (DELTA_STEPS, ComparisonError, acceptance_side_by_side, delta_tone, run_acceptance,
                                      run_comparison, run_settings)
from tests.services.checkpoints.test_best_by_tau import _launch, _made, _served, _trained

pytestmark = pytest.mark.django_db

# Per epoch, the acceptance per position each measurement reports (τ = 1 + its sum).
A = {0: [0.6, 0.4, 0.2], 1: [0.7, 0.5, 0.3], 2: [0.8, 0.6, 0.4]}  # τ 2.2, 2.5, 2.8: epoch 2 best
B = {0: [0.5, 0.3], 1: [0.78, 0.52], 2: [0.7, 0.5]}  # τ 1.8, 2.3, 2.2: epoch 1 best, the stage's own
VLLM_ACCEPTANCE = [0.5, 0.3, 0.2]  # what tests.services.checkpoints.test_best_by_tau._served reports for vLLM


def _result(checkpoint, acceptance: list[float]):
    from pathlib import Path

    from workers.stages.evaluate.measure import EvaluationResult

    return _made(
        EvaluationResult, checkpoint_dir=Path(checkpoint.path), target_dir=Path("/target"),
        num_speculative_tokens=len(acceptance), max_new_tokens=64, num_prompts=4,
        prompt_source="validation conversations", tau=1 + sum(acceptance), acceptance_per_position=acceptance,
        new_tokens=256, verify_forwards=100, output_matches_greedy=True, mismatched_prompts=[], spec_seconds=1.0,
        greedy_seconds=2.0, spec_tokens_per_s=256.0, greedy_tokens_per_s=128.0, speedup=2.0, device="cpu",
        seconds=3.0)


def _evaluated(run, checkpoints, acceptance: dict[int, list[float]]) -> None:
    """The evaluate stage as a worker plays it (tests.services.checkpoints.test_best_by_tau._evaluated), with these
    acceptances: every other checkpoint beside the stage's, then the stage's own row, of the trainer's mark."""
    from runs.pipeline.lifecycle.result_records import evaluation_record, measured_alongside_record
    from runs.models import Evaluation
    from runs.pipeline.lifecycle.stage_services import stage_start

    marked = next(c for c in checkpoints.values() if c.is_best)
    Evaluation.objects.filter(pk=run.evaluation.pk).update(checkpoint=marked)
    stage = Evaluation.objects.get(pk=run.evaluation.pk)
    for epoch, checkpoint in checkpoints.items():
        if checkpoint != marked:
            measured_alongside_record(measured=stage, checkpoint_id=checkpoint.pk,
                                      result=_result(checkpoint, acceptance[epoch]))
    started = stage_start(stage_name="evaluate", record_id=run.evaluation.pk, worker="test").started_at
    evaluation_record(record_id=run.evaluation.pk, result=_result(marked, acceptance[marked.epoch]), log_tail="",
                      started_at=started)


def _measured_run(user, roots, acceptance=A):
    run = _launch(user, roots)
    checkpoints = _trained(run)
    _evaluated(run, checkpoints, acceptance)
    return run, checkpoints


@pytest.fixture
def three(user, roots):
    a, a_checkpoints = _measured_run(user, roots, A)
    b, _ = _measured_run(user, roots, B)
    c = _launch(user, roots)
    _trained(c)  # trained; its evaluate stage is still queued
    return a, b, c, a_checkpoints


def _rows(run_ids) -> dict[int, dict]:
    return {row["run_id"]: row for row in run_comparison(run_ids=run_ids)["acceptance"]["rows"]}


def test_each_row_is_the_best_checkpoints_measurement_not_the_stage_row_when_the_best_moved(three):
    a, b, c, a_checkpoints = three
    acceptance = run_comparison(run_ids=[a.pk, b.pk, c.pk])["acceptance"]
    rows = {row["run_id"]: row for row in acceptance["rows"]}
    assert acceptance["positions"] == [1, 2, 3]  # the largest k measured
    # A: the stage row measured epoch 1 (0.7, 0.5, 0.3); the best moved to epoch 2, whose values show.
    assert a.evaluation.__class__.objects.get(pk=a.evaluation.pk).acceptance_per_position == A[1]
    assert (rows[a.pk]["values"], rows[a.pk]["epoch"], rows[a.pk]["best"]) == (A[2], 2, True)
    assert rows[a.pk]["checkpoint_id"] == a_checkpoints[2].pk and rows[a.pk]["evaluation_id"] != a.evaluation.pk
    assert rows[a.pk]["tau"] == pytest.approx(2.8) and rows[a.pk]["k"] == 3
    # B: k=2, its best is the stage row's checkpoint.
    assert (rows[b.pk]["values"], rows[b.pk]["epoch"], rows[b.pk]["k"]) == (B[1], 1, 2)
    assert rows[b.pk]["evaluation_id"] == b.evaluation.pk
    # C says so, with no cells.
    assert (rows[c.pk]["measured"], rows[c.pk]["cells"]) == (False, [])
    assert rows[c.pk]["why"] == "not measured yet: its evaluate stage is queued"
    # The run page shows the same measurement for each run (runs.pipeline.status.run_summary).
    for run in (a, b):
        summary = run_summary(selectors.run_list().get(pk=run.pk))
        assert summary["acceptance"]["acceptance_per_position"] == rows[run.pk]["values"]
        assert summary["acceptance"]["id"] == rows[run.pk]["evaluation_id"]


def test_deltas_against_the_first_run_and_against_another_baseline(three):
    a, b, c, _ = three
    acceptance = run_comparison(run_ids=[a.pk, b.pk, c.pk])["acceptance"]
    rows = {row["run_id"]: row for row in acceptance["rows"]}
    assert (acceptance["baseline"], acceptance["baseline_name"]) == (a.pk, str(a))
    # The default baseline, A: its own row neutral; B below it by 2 and 8 points, blank past its k=2.
    assert [(c_["text"], c_["delta_text"], c_["tone"]) for c_ in rows[a.pk]["cells"]] == [
        ("80.0 %", "baseline", "base"), ("60.0 %", "baseline", "base"), ("40.0 %", "baseline", "base")]
    assert [c_["delta"] for c_ in rows[b.pk]["cells"]] == [pytest.approx(-0.02), pytest.approx(-0.08), None]
    assert [(c_["text"], c_["delta_text"], c_["tone"]) for c_ in rows[b.pk]["cells"]] == [
        ("78.0 %", "−2.0 pp", "down-2"), ("52.0 %", "−8.0 pp", "down-3"), ("", "", "blank")]
    # Against B, asked for: A is above by 2 and 8 points, and B has no value at A's third position.
    against_b = run_comparison(run_ids=[a.pk, b.pk, c.pk], baseline_id=b.pk)["acceptance"]
    rows = {row["run_id"]: row for row in against_b["rows"]}
    assert (against_b["baseline"], against_b["baseline_name"]) == (b.pk, str(b))
    assert [(c_["delta_text"], c_["tone"]) for c_ in rows[a.pk]["cells"]] == [
        ("+2.0 pp", "up-2"), ("+8.0 pp", "up-3"), ("no baseline", "none")]
    assert [(c_["delta_text"], c_["tone"]) for c_ in rows[b.pk]["cells"]] == [
        ("baseline", "base"), ("baseline", "base"), ("", "blank")]
    assert [c_["text"] for c_ in rows[a.pk]["cells"]] == ["80.0 %", "60.0 %", "40.0 %"]  # values never move
    # Only a measured run of those compared can be the baseline; the refusal names it.
    # The API's read refuses; the page's falls back to the first measured run and says why.
    with pytest.raises(ComparisonError, match=f"baseline: run {c.pk} has no measured acceptance"):
        run_acceptance(run_ids=[a.pk, b.pk, c.pk], baseline_id=c.pk)
    with pytest.raises(ComparisonError, match=f"baseline: run {c.pk} is not among the runs compared"):
        run_acceptance(run_ids=[a.pk, b.pk], baseline_id=c.pk)
    fell_back = run_comparison(run_ids=[a.pk, b.pk, c.pk], baseline_id=c.pk)["acceptance"]
    assert (fell_back["baseline"], fell_back["refused"]) == (a.pk, f"baseline: run {c.pk} has no measured acceptance")
    # The first measured run is the default baseline, whatever order the runs come in.
    assert run_comparison(run_ids=[c.pk, b.pk, a.pk])["acceptance"]["baseline"] == b.pk


def test_a_deltas_colour_by_its_size_and_sign():
    assert DELTA_STEPS == (0.005, 0.02, 0.05)
    assert [delta_tone(d) for d in (None, 0.0, 0.004, -0.004, 0.005, -0.019, 0.02, -0.049, 0.05, -0.3)] == [
        "none", "same", "same", "same", "up-1", "down-1", "up-2", "down-2", "up-3", "down-3"]


def test_the_page_shows_the_table_with_its_definition_deltas_and_the_unmeasured_row(client, user, three):
    a, b, c, _ = three
    client.force_login(user)
    response = client.get("/runs/compare/", {"ids": f"{a.pk},{b.pk},{c.pk}"})
    assert response.status_code == 200
    page = response.content.decode()
    table = page.split('id="acceptance-heatmap"')[1].split("</table>")[0]
    assert "the share of the target's verification forwards" in table  # the caption's definition
    assert "accepted past a reply's end" in table  # and why vLLM's counters are not in it
    row_b = table.split(f'data-run="{b.pk}"')[1].split("</tr>")[0]
    assert row_b.count('class="acc acc-') == 3 and 'class="acc acc-blank"' in row_b
    assert "78.0 %" in row_b and "−8.0 pp" in row_b and "acc-down-3" in row_b
    row_c = table.split(f'data-run="{c.pk}"')[1].split("</tr>")[0]
    assert "not measured yet: its evaluate stage is queued" in row_c and 'colspan="5"' in row_c
    assert f'data-run="{a.pk}" class="baseline"' in table
    # The select offers the measured runs, the first chosen; the script asks the API for another baseline's.
    select = page.split('id="acceptance-baseline"')[1].split("</select>")[0]
    assert f'value="{a.pk}" selected' in select and f'value="{b.pk}"' in select and f'value="{c.pk}"' not in select
    assert f'data-api="/api/v1/compare/acceptance/?ids={a.pk},{b.pk},{c.pk}"' in table
    assert "js/compare/acceptance_heatmap.js" in page
    assert 'id="compare-loss-tau"' in page  # the loss-vs-τ scatter stays


def test_ours_not_vllms_and_a_serve_check_moves_no_best(user, roots, three):
    from runs.checkpoints.serve_check_services import serve_check_request

    a, b, c, a_checkpoints = three
    check, _ = serve_check_request(checkpoint=a_checkpoints[1], user=user, enqueue=False)
    _served(check, vllm_tau=3.0)  # vLLM's τ of epoch 1 is above epoch 2's by ours: it chooses nothing
    row = _rows([a.pk, b.pk])[a.pk]
    assert (row["epoch"], row["values"], row["tau"]) == (2, A[2], pytest.approx(2.8))
    assert row["values"] != VLLM_ACCEPTANCE
    assert run_comparison(run_ids=[a.pk, b.pk])["runs"][0]["tau"] == pytest.approx(2.8)  # compare's τ: the best's, ours


def test_a_run_trained_elsewhere_has_no_measurement_of_ours(user, roots, three):
    from runs.pipeline.launch.external import external_run_create

    a, *_ = three
    elsewhere = external_run_create(user=user, name="elsewhere", config={"epochs": 1})
    rows = _rows([elsewhere.pk, a.pk])
    assert (rows[elsewhere.pk]["measured"], rows[elsewhere.pk]["why"]) == (
        False, "trained elsewhere: no measurement of ours")


def test_no_run_measured_gives_no_baseline(user, roots):
    runs = [_launch(user, roots) for _ in range(2)]
    acceptance = acceptance_side_by_side(list(selectors.run_list().filter(pk__in=[r.pk for r in runs])))
    assert (acceptance["positions"], acceptance["baseline"]) == ([], None)
    assert all(row["why"] == "not measured yet: its evaluate stage is queued" for row in acceptance["rows"])


def test_the_settings_compare_shows_are_the_run_pages(user, roots):
    """run_comparison reads each run's data policy from the runs' own query; its words are run_settings'."""
    from runs.data.models import Dataset
    from runs.pipeline.jobs.models import DatasetRegeneration

    runs = [_launch(user, roots) for _ in range(3)]
    other_target = type(runs[0].target).objects.create(
        name="other", path=str(roots / "other"), architecture="LlamaForCausalLM", model_type="llama", num_layers=8,
        hidden_size=64, vocab_size=5000)
    for run, target, temperature in ((runs[0], runs[0].target, 0.0), (runs[1], other_target, 0.7)):
        made = Dataset.objects.create(name=f"made-{run.pk}", path=str(roots / f"made-{run.pk}.jsonl"))
        DatasetRegeneration.objects.create(source=run.dataset, source_path=run.dataset.path, target=target,
                                           backend="vllm", max_new_tokens=16, temperature=temperature,
                                           settings_key=f"k{run.pk}", output_path=made.path, dataset=made)
        PipelineRun.objects.filter(pk=run.pk).update(dataset=made)
    compared = run_comparison(run_ids=[r.pk for r in runs])
    data = next(row["values"] for row in compared["differ"] if row["name"] == "data")
    expected = [run_settings(PipelineRun.objects.get(pk=r.pk))["data"] for r in runs]
    assert data == expected
    assert data[0] == "on-policy: replies regenerated by this run's target (vllm, greedy)"
    assert data[1].startswith("off-policy: replies regenerated by other") and data[2].startswith("off-policy")


def _compare_queries(client, runs) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/runs/compare/", {"ids": ",".join(str(r.pk) for r in runs)})
    assert response.status_code == 200
    assert response.content.decode().count('class="acc acc-base"') == 3  # the baseline's three cells
    return len(ctx)


def test_compare_costs_the_same_queries_for_3_runs_and_10(client, user, roots):
    client.force_login(user)
    runs = [_measured_run(user, roots, B if i % 2 else A)[0] for i in range(3)]
    few = _compare_queries(client, runs)
    runs += [_measured_run(user, roots, B if i % 2 else A)[0] for i in range(7)]
    assert _compare_queries(client, runs) == few
    # Session, user, the runs (of the viewer's projects), the curves' summaries, the best checkpoints, their
    # measurements, the viewer's unread alerts.
    assert few <= 7, few


def test_the_page_and_the_api_show_another_baseline_and_refuse_a_bad_one(client, user, three):
    """Without the script the select's form asks the page with ?baseline=; the script asks the API: both
    word B's row against A and A's against B as acceptance_side_by_side does. A baseline that cannot be
    shown is refused by the API naming it; the page (a link saved with ?baseline=) falls back to the first
    measured run and says why."""
    a, b, c, _ = three
    client.force_login(user)
    page = client.get("/runs/compare/", {"ids": f"{a.pk},{b.pk},{c.pk}", "baseline": b.pk}).content.decode()
    table = page.split('id="acceptance-heatmap"')[1].split("</table>")[0]
    row_a = table.split(f'data-run="{a.pk}"')[1].split("</tr>")[0]
    assert "+8.0 pp" in row_a and "acc-up-3" in row_a and f'data-run="{b.pk}" class="baseline"' in table
    answer = client.get("/api/v1/compare/acceptance/", {"ids": f"{a.pk},{b.pk},{c.pk}", "baseline": b.pk}).json()
    rows = {row["run_id"]: row for row in answer["rows"]}
    assert answer["baseline"] == b.pk and answer["positions"] == [1, 2, 3]
    assert [cell["delta_text"] for cell in rows[a.pk]["cells"]] == ["+2.0 pp", "+8.0 pp", "no baseline"]
    assert rows[c.pk]["why"] == "not measured yet: its evaluate stage is queued"
    for query, field, named in (
            ({"ids": f"{a.pk},{b.pk},{c.pk}", "baseline": c.pk}, "baseline", f"run {c.pk} has no measured"),
            ({"ids": f"{a.pk},{b.pk}", "baseline": "x1"}, "baseline", "'x1' is not a run id"),
            ({"ids": f"{a.pk}"}, "ids", "pick 2 to 50 runs")):
        refused = client.get("/api/v1/compare/acceptance/", query)
        assert refused.status_code == 400 and named in refused.json()["fields"][field], refused.content
        page = client.get("/runs/compare/", query)
        text = html.unescape(page.content.decode())
        if field == "ids":
            assert page.status_code == 400 and named in text
        else:  # a saved link's stale baseline: the runs still compare, against the first measured, said so
            assert page.status_code == 200 and named in text and "against the first measured run instead" in text
            assert f'data-run="{a.pk}" class="baseline"' in text
