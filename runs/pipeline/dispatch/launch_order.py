"""Within a queue, runs go in the order they were launched: a worker that takes a stage's message
runs the waiting stage, on that message's queue, of the earliest-launched run, which is its own
stage or an earlier run's.

A run's stages are handed over one at a time (runs.pipeline.dispatch.queue), so a queue is first in, first
out by hand-over: run 2's extraction, handed over while run 1's vocabulary was still building,
stood ahead of run 1's training in the gpu queue. Every stage's message on a queue is one turn of
that queue: whichever message a worker takes, the turn goes to the earliest run's stage that waits
there; the message of the stage that ran instead later finds its own stage taken and gives its turn
to the next one (or to nothing, when no stage waits). A worker takes a stage only when a message
arrives, so every waiting stage keeps a message of its own queue.

A worker never holds back for a stage that is not ready: while run 1's vocabulary builds on the
cpu worker, the gpu worker runs run 2's extraction rather than sit idle, and run 1's training waits
for it to finish (the run page says so, naming it). Launch order decides among stages that are
ready; a stage that runs is never stopped for an earlier run's.

A run is launched when its stages may first be handed over: a sweep's run when its sweep releases
it (runs.sweeps.release), so that a sweep never jumps ahead of runs launched while it held them.
Jobs (a serve check, a regeneration) and a checkpoint's own measurement keep their message's turn.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.dispatch.queue import run_next_stage
from runs.pipeline.dispatch.routing import stage_queue
from runs.pipeline.lifecycle.stages import STAGES, STAGES_BY_NAME

# A claim from the moment a worker chooses a stage until stage_start replaces it with the lease
# (runs.pipeline.dispatch.message_claims.CLAIM_SECONDS: the reconcilers renew a live worker's lapsed claim).
CHOOSE_CLAIM_SECONDS = 10


def launch_key(run: PipelineRun) -> tuple[datetime, int]:
    """A run's place in launch order (earlier first): its sweep's release, or its creation."""
    entry = getattr(run, "sweep_entry", None)  # None for a run outside a sweep
    return (getattr(entry, "released_at", None) or run.created_at, run.pk)


def _handed_over_runs():
    """Runs whose stages are in the queues: not trained elsewhere, not held back by their sweep."""
    return PipelineRun.objects.filter(external=False).filter(
        Q(sweep_entry__isnull=True) | Q(sweep_entry__released_at__isnull=False)
    ).annotate(launched=Coalesce("sweep_entry__released_at", F("created_at")))


def launch_times(*, run_ids) -> dict[int, datetime]:
    """Each run's launch (its sweep's release of it, or its creation), by id."""
    return dict(PipelineRun.objects.filter(pk__in=run_ids).annotate(
        launched=Coalesce("sweep_entry__released_at", F("created_at"))).values_list("pk", "launched"))


def waiting_in_queue(*, queue: str) -> list[tuple[str, int]]:
    """(stage, run id) of every ready stage waiting in `queue`, in launch order: each run's next
    stage, when it is queued (not behind an unfinished stage of its run) and goes to `queue`."""
    waiting = []
    for stage in STAGES:
        rows = stage.model.objects.filter(status=StageStatus.QUEUED, run__in=_handed_over_runs())
        waiting += rows.values_list("run_id", flat=True)
    runs = _handed_over_runs().filter(pk__in=set(waiting)).order_by("launched", "pk").only("pk", "config")
    found = []
    for run in runs:
        name = run_next_stage(run_id=run.pk)
        if name is not None and stage_queue(stage_name=name, config=run.config or {}) == queue:
            found.append((name, run.pk))
    return found


def stage_choose(*, stage_name: str, run_id: int, worker: str) -> tuple[str, int] | None:
    """The (stage, run id) that the worker which took the message of `stage_name` of run `run_id`
    runs now: the earliest-launched ready stage in that message's queue that no other worker has
    claimed, claimed for `worker`; None when none waits (its own stage ran already)."""
    config = PipelineRun.objects.filter(pk=run_id).values_list("config", flat=True).first()
    if config is None:
        return None
    queue = stage_queue(stage_name=stage_name, config=config or {})
    now = timezone.now()
    for name, candidate in waiting_in_queue(queue=queue):
        with transaction.atomic():
            rows = STAGES_BY_NAME[name].model.objects.select_for_update(skip_locked=True).filter(
                run_id=candidate, status=StageStatus.QUEUED)
            # Another worker holding this stage's message runs it; a lapsed claim's worker is gone.
            row = rows.filter(Q(worker="") | Q(worker=worker[:200]) | Q(lease_expires_at__lt=now)
                              | Q(lease_expires_at__isnull=True)).first()
            if row is None:
                continue
            rows.filter(pk=row.pk).update(worker=worker[:200],
                                          lease_expires_at=now + timedelta(seconds=CHOOSE_CLAIM_SECONDS))
            return name, candidate
    return None


def later_run_ahead(*, run: PipelineRun, stage_name: str) -> dict | None:
    """For a ready stage of `run` waiting in its queue: the stage of a later-launched run that runs
    in the same queue now ({"stage", "label", "run_id", "same_project", "worker"}), the one it waits behind;
    None. `same_project`: whether that run is in `run`'s project, so that whoever sees `run` sees it too."""
    queue = stage_queue(stage_name=stage_name, config=run.config or {})
    mine = launch_key(run)
    for stage in STAGES:
        running = stage.model.objects.filter(status=StageStatus.RUNNING, run__in=_handed_over_runs()).exclude(
            run_id=run.pk).select_related("run", "run__sweep_entry")
        for row in running:
            if (stage_queue(stage_name=stage.name, config=row.run.config or {}) == queue
                    and launch_key(row.run) > mine):
                return {"stage": stage.name, "label": stage.label, "run_id": row.run_id,
                        "same_project": row.run.project_id == run.project_id, "worker": row.worker}
    return None

