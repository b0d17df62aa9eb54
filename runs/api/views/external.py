"""Runs trained elsewhere, through the API: created with the trainer's settings (POST /api/v1/runs/ with
"external": true, RunList's branch), then fed curves, checkpoints and their end by their client. Thin:
the rules are runs.pipeline.launch.external's; a request that does not fit the run's state (a pipeline run, an
ended run) is a 409."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from runs.api import shapes
from runs.api.shapes import launched
from runs.api.base import ApiView, created, error_response
from runs.api.bodies.serializers import ExternalCheckpointSerializer, RunEndSerializer
from runs.pipeline.launch import external
from runs.pipeline import selectors


class Conflict(Exception):
    def __init__(self, response: Response):
        self.response = response


@contextmanager
def state_conflicts() -> Iterator[None]:
    try:
        yield
    except external.RunStateError as exc:
        raise Conflict(error_response(str(exc), code=409)) from None


def external_run_create(view: ApiView, request) -> Response:
    """RunList.post's branch for a body with "external"."""
    body = view.body("POST external")
    if body["external"] is not True:
        raise ValidationError({"external": ["external must be true for a run trained elsewhere; omit it to launch "
                                            "a pipeline run"]})
    run = external.external_run_create(user=request.user, name=body["name"], config=body["config"],
                                       target_path=body.get("target", ""), dataset_path=body.get("dataset", ""))
    return launched(run, request)


def external_points_post(view: ApiView, request, pk: int) -> Response:
    """RunMetrics.post: a batch of points, all stored or none."""
    body = view.body()
    run = selectors.run_get(pk=pk, stages=False, user=request.user)
    try:
        with state_conflicts():
            counts = external.external_points_report(run=run, user=request.user, points=body["points"])
    except Conflict as conflict:
        return conflict.response
    return Response({"accepted": counts.accepted, "unchanged": counts.unchanged, "replaced": counts.replaced})


class RunCheckpoints(ApiView):
    request_serializers = {"POST": ExternalCheckpointSerializer}
    responses = {"POST": {"201": "{id, run, epoch, path, verifier_path, url, created: true}",
                          "200": "the same path at the same epoch again: that checkpoint, created: false",
                          "409": "the run is a pipeline run (its workers register its checkpoints)"}}

    def post(self, request, pk: int):
        """Register a checkpoint a run trained elsewhere wrote, checked as import_checkpoint checks one.

        Under the data roots, speculators' eagle3 layout (config.json, model.safetensors), loaded with
        Eagle3DraftModel against its verifier; a bad one is refused (400 naming the problem) and nothing
        is stored."""
        body = self.body()
        run = selectors.run_get(pk=pk, stages=False, user=request.user)
        try:
            with state_conflicts():
                checkpoint, made = external.external_checkpoint_register(
                    run=run, user=request.user, path=body["path"], epoch=body["epoch"],
                    verifier=body.get("verifier", ""))
        except Conflict as conflict:
            return conflict.response
        answer = {"id": checkpoint.pk, "run": run.pk, "epoch": checkpoint.epoch, "path": checkpoint.path,
                  "verifier_path": checkpoint.verifier_path, "val_loss": checkpoint.val_loss,
                  "url": shapes.api_url(request, "checkpoint_detail", checkpoint.pk), "created": made}
        return created(answer) if made else Response(answer)


class RunEnd(ApiView):
    request_serializers = {"POST": RunEndSerializer}
    responses = {"POST": {"200": "{id, status, finished_at}",
                          "409": "a pipeline run, or a run that has ended already"}}

    def post(self, request, pk: int):
        """End a run trained elsewhere: succeeded, failed or cancelled, with a message shown on its page.

        An ended run takes no more points (409)."""
        body = self.body()
        run = selectors.run_get(pk=pk, stages=False, user=request.user)
        try:
            with state_conflicts():
                training = external.external_run_end(run=run, user=request.user, status=body["status"],
                                                     message=body.get("message", ""))
        except Conflict as conflict:
            return conflict.response
        return Response({"id": run.pk, "status": training.status, "finished_at": training.finished_at.isoformat()})
