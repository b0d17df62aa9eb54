"""A run as the API answers it, for every view that answers with one (runs.api.views_runs, views_external)."""
from __future__ import annotations

from rest_framework.response import Response

from runs.api import shapes
from runs.api.base import created
from runs.pipeline import queue, selectors


def run_answer(pk: int, request) -> dict:
    """A run as GET /api/v1/runs/<id>/ answers it: the run summary (runs.pipeline.selectors.run_summary,
    as run_pipeline --json prints it) with its id, tags and where to find it."""
    run = selectors.run_get(pk=pk, user=request.user)  # 404 outside the user's projects
    return {"id": run.pk, **selectors.run_summary(run), "owner": run.owner.get_username(),
            "created_at": run.created_at.isoformat(), "tags": [tag.name for tag in run.tags.all()],
            "waiting_for_queue": _waiting(queue.run_waiting_for_queue(run_id=run.pk)),
            "url": shapes.api_url(request, "run_detail", run.pk),
            "page_url": request.build_absolute_uri(run.get_absolute_url())}


def _waiting(pending) -> dict | None:
    """The run's hand-over the broker refused, as JSON (null when none): the run is stored and the outbox
    (runs.pipeline.queue) sends it once the broker answers, so a client needs no retry of its own."""
    if pending is None:
        return None
    return {"attempts": pending.attempts, "last_error": pending.last_error[:500],
            "since": pending.created_at.isoformat()}


def launched(run, request) -> Response:
    """201 with the run and its Location."""
    response = created(run_answer(run.pk, request))
    response["Location"] = shapes.api_url(request, "run_detail", run.pk)
    return response
