"""Fair queueing of sweeps: a sweep hands at most `parallel` of its runs to the queues at a time.

Celery's queues are first in, first out and shared by everyone, so a sweep of 16 runs handed over at
once would put 16 prepare stages ahead of any run launched after it. Interleaving would mean reordering
messages the broker already holds, which Redis cannot do; holding a sweep's later runs back in the
database can. So a sweep's runs are all stored (and validated) at launch, its first `parallel` go to the
queue, and each time one of them finishes (succeeded, failed or cancelled) the next one follows: a run
launched by someone else waits behind at most `parallel` of a sweep's runs in any queue, however large
the sweep. The workers' reconciler calls sweeps_release() too, so a release missed by a worker that died
at the wrong moment happens within a lease.

Imported by the pipeline's services (a run finished), so it imports only models and the queue."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES
from runs.sweeps.models import SweepRun, Sweep
from runs.pipeline.dispatch.queue import pipeline_enqueue
from runs.pipeline.lifecycle.stages import STAGES


def runs_unfinished(run_ids: list[int]) -> set[int]:
    """The runs among `run_ids` with a stage not yet succeeded, failed or cancelled."""
    unfinished: set[int] = set()
    for stage in STAGES:
        unfinished |= set(stage.model.objects.filter(run_id__in=run_ids).exclude(
            status__in=FINISHED_STATUSES).values_list("run_id", flat=True))
    return unfinished


@transaction.atomic
def sweep_release(*, sweep_id: int) -> list[int]:
    """Hand the sweep's next held runs to the queue while fewer than `parallel` of its handed-over runs
    are unfinished; the ids handed over. The sweep's row is locked, so two workers finishing two of its
    runs at once hand over one run each, not two each."""
    sweep = Sweep.objects.select_for_update().filter(pk=sweep_id).first()
    if sweep is None:
        return []
    entries = list(SweepRun.objects.filter(sweep=sweep).order_by("position").values_list("pk", "run_id", "released_at"))
    unfinished = runs_unfinished([run_id for _, run_id, _ in entries])
    active = sum(1 for _, run_id, released in entries if released and run_id in unfinished)
    now, handed = timezone.now(), []
    for pk, run_id, released in entries:
        if released:
            continue
        if run_id not in unfinished:  # cancelled while it waited: nothing to queue, and it holds no place
            SweepRun.objects.filter(pk=pk).update(released_at=now)
            continue
        if active >= sweep.parallel:
            break
        SweepRun.objects.filter(pk=pk).update(released_at=now)
        for stage in STAGES:  # it joins its queues now, behind what was launched while it waited
            stage.model.objects.filter(run_id=run_id).update(queued_at=now)
        pipeline_enqueue(run_id=run_id)
        handed.append(run_id)
        active += 1
    return handed


def sweep_release_after(*, run_id: int) -> list[int]:
    """A run finished (or was cancelled): if it belongs to a sweep, hand over the sweep's next runs."""
    sweep_id = SweepRun.objects.filter(run_id=run_id).values_list("sweep_id", flat=True).first()
    return sweep_release(sweep_id=sweep_id) if sweep_id is not None else []


def sweeps_release() -> list[int]:
    """Every sweep with runs still held back: what a missed release left (the workers' reconciler)."""
    sweep_ids = SweepRun.objects.filter(released_at__isnull=True).values_list("sweep_id", flat=True).distinct()
    return [run_id for sweep_id in list(sweep_ids) for run_id in sweep_release(sweep_id=sweep_id)]
