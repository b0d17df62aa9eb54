"""Reads about a training across nodes: who holds which rank (runs.pipeline.nodes.services writes them)."""
from __future__ import annotations

from django.db.models import Count

from runs.pipeline.nodes.models import TrainingNode


def training_nodes(*, training_id: int | None) -> list[dict]:
    """The ranks of the training's latest attempt, rank first: [] for a training on one node."""
    if training_id is None:
        return []
    rows = list(TrainingNode.objects.filter(training_id=training_id).order_by("-attempt", "rank"))
    latest = rows[0].attempt if rows else None
    return [{"rank": n.rank, "worker": n.worker or None, "host": n.host or None, "status": n.status,
             "attempt": n.attempt, "error": n.error or None} for n in rows if n.attempt == latest]


def worker_ranks(*, worker_names: list[str]) -> dict[str, dict]:
    """For each of these workers holding a rank of a running training now: its rank, run and training
    (two queries, whatever the number of workers)."""
    held = list(TrainingNode.objects.filter(worker__in=worker_names, status__in=[TrainingNode.Status.JOINED,
                                                                                  TrainingNode.Status.RUNNING])
                .select_related("training__run").order_by("started_at"))
    sizes = {(row["training_id"], row["attempt"]): row["size"] for row in TrainingNode.objects.filter(
        training_id__in={n.training_id for n in held}).values("training_id", "attempt").annotate(size=Count("id"))}
    return {n.worker: {"rank": n.rank, "run_id": n.training.run_id, "run_name": n.training.run.name,
                       "training_id": n.training_id, "since": n.started_at,
                       "nodes": sizes.get((n.training_id, n.attempt), 0)} for n in held}
