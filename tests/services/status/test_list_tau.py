"""The runs list's τ kept on the run's row (PipelineRun.list_tau, runs.pipeline.status.list_tau; issue 40): after
the evaluate stage and best_decide ran as the workers run them, every run's equals its definition (the best
checkpoint's τ, else the evaluate stage's), and the list's τ filter and sort read it without joining the
training and evaluation rows of every run."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import PipelineRun
from runs.pipeline import services
from runs.pipeline.status.list_tau import list_tau_expression
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.runs_list.run_filters import RunFilters
from runs.tracking.runs_list.run_table import run_table
from tests.api.conftest import people  # noqa: F401 - the users
from tests.services.status import test_shown_tau
from tests.services.checkpoints.test_best_by_tau import _trained

pytestmark = pytest.mark.django_db
two_runs = test_shown_tau.two_runs  # A best 2.41 (not its stage row's 2.30), B best 2.35


def test_each_runs_list_tau_is_its_definition_and_the_list_filters_by_it(two_runs, people, roots):
    _, a, b = two_runs
    trained = services.run_launch(user=people["launcher"][0], target_path=roots / "target",
                                  dataset_path=roots / "chats.jsonl", config=RunConfig(draft_vocab_size=64),
                                  enqueue=False)
    _trained(trained)  # trained, not measured: no τ yet
    kept = dict(PipelineRun.objects.values_list("pk", "list_tau"))
    defined = dict(PipelineRun.objects.annotate(defined=list_tau_expression()).values_list("pk", "defined"))
    assert kept == defined == {a.pk: 2.41, b.pk: 2.35, trained.pk: None}
    with CaptureQueriesContext(connection) as queries:
        page, count = run_table(filters=RunFilters(tau_min=2.0, sort="tau", descending=True))
    assert [run.pk for run in page.object_list] == [a.pk, b.pk] and count == 2
    ids_query = queries.captured_queries[0]["sql"]
    assert "list_tau" in ids_query and "runs_trainingrun" not in ids_query and "runs_evaluation" not in ids_query
    page, _ = run_table(filters=RunFilters(tau_max=2.40, sort="tau", descending=False))
    assert [run.pk for run in page.object_list] == [b.pk]
