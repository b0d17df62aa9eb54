"""The τ the runs list filters and sorts by, kept on the run's row (PipelineRun.list_tau, migration 0034;
issue 40): its training's best_tau, else its evaluate stage's τ, as the list read them through two joins.
At 100,000 runs a saved view with a τ filter joined each of its project's runs to both rows (half its
~300 ms under load); from the row it is a column like the others. Written where either changes:
best_decide when it moves best_tau, evaluation_record once the evaluate stage measured."""
from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce

from runs.checkpoints.models import Evaluation
from runs.pipeline.models import PipelineRun, TrainingRun


def list_tau_expression() -> Coalesce:
    """The definition, per run in SQL: what list_tau must equal (tests/services/status/test_list_tau.py)."""
    return Coalesce(Subquery(TrainingRun.objects.filter(run_id=OuterRef("pk")).values("best_tau")[:1]),
                    Subquery(Evaluation.objects.filter(run_id=OuterRef("pk")).values("tau")[:1]))


def run_list_tau_refresh(*, run_id: int) -> None:
    PipelineRun.objects.filter(pk=run_id).update(list_tau=list_tau_expression())
