"""The τ a run is known by outside its own page (the runs list and its sort, the API's list, a sweep's
best run, compare, the run page's glance) is its best checkpoint's once the run's rule decided it, not
the evaluate stage's own row (which measured the trainer's lowest-loss choice).

Two runs of one sweep: A's best by τ (epoch 2, τ 2.41) is not the checkpoint its stage row measured
(epoch 1, τ 2.30); B's best is its stage row's own (epoch 1, τ 2.35). By the stage rows B ranks first;
by the best checkpoints A does."""
from __future__ import annotations

import pytest

from runs.models import SweepRun
from runs.pipeline import selectors
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline.launch.run_config import RunConfig
from runs.sweeps import selectors as sweep_selectors
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary
from runs.tracking.comparison import run_comparison
from runs.tracking.runs_list.run_filters import RunFilters
from runs.tracking.runs_list.run_table import run_table
from tests.api.conftest import ApiClient, people  # noqa: F401 - the users and tokens of the API tests
from tests.services.checkpoints.test_best_by_tau import LOSSES, _evaluated, _summary, _trained

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_runs(people, roots):
    user = people["launcher"][0]
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(draft_vocab_size=64), varied=[parse_vary("seed=1,2")], parallel=2)
    a, b = [entry.run for entry in SweepRun.objects.filter(sweep=sweep).order_by("position").select_related("run")]
    _evaluated(a, _trained(a), taus={0: 2.0, 1: 2.30, 2: 2.41})
    _evaluated(b, _trained(b), taus={0: 2.0, 1: 2.35, 2: 2.20})
    return sweep, a, b


def test_lists_sweeps_compare_and_the_api_show_the_best_checkpoints_tau(two_runs, people):
    sweep, a, b = two_runs
    assert (a.evaluation.__class__.objects.get(pk=a.evaluation.pk).tau, _summary(a)["best"]["tau"]) == (2.30, 2.41)

    page, _ = run_table(filters=RunFilters(sort="tau", descending=True))
    assert [run.pk for run in page.object_list][:2] == [a.pk, b.pk]
    assert [run.shown_tau for run in page.object_list][:2] == [2.41, 2.35]
    page, _ = run_table(filters=RunFilters(sort="tau", descending=False))
    assert [run.pk for run in page.object_list][-2:] == [b.pk, a.pk]  # never measured ones last either way

    listed = ApiClient(people["viewer"][1]).get("/api/v1/runs/", {"sort": "-tau"}).json()["results"]
    assert [(r["id"], r["tau"]) for r in listed][:2] == [(a.pk, 2.41), (b.pk, 2.35)]

    from runs.models import TrainingRun

    TrainingRun.objects.filter(run=a).update(tokens_per_second=1234.5)
    rows, best = sweep_selectors.sweep_rows(sweep=sweep)
    assert (best.row.run.pk, best.row.tau) == (a.pk, 2.41)
    # Beside τ the sweep page shows each run's lowest validation loss and its training's tokens/s.
    assert [(r.val_loss, r.tokens_per_s) for r in rows] == [(min(LOSSES.values()), 1234.5), (min(LOSSES.values()), None)]
    compared = run_comparison(run_ids=[a.pk, b.pk])
    assert [(r["run"].pk, r["tau"]) for r in compared["runs"]] == [(a.pk, 2.41), (b.pk, 2.35)]


def test_the_glance_shows_no_best_tau_until_the_evaluate_stage_decided_it(people, roots):
    from runs.pipeline import services

    run = services.run_launch(user=people["launcher"][0], target_path=roots / "target",
                              dataset_path=roots / "chats.jsonl", config=RunConfig(draft_vocab_size=64), enqueue=False)
    checkpoints = _trained(run)
    glance = _summary(run)["glance"]
    assert glance["best_tau"] is None and glance["best_provisional"] is True
    _evaluated(run, checkpoints)
    glance = run_summary(selectors.run_list().get(pk=run.pk))["glance"]
    assert (glance["best_tau"], glance["best_provisional"]) == (2.41, False)
