"""Messages a worker took but never ran: the stage's row says who took it, and the reconcilers send
the message again when that worker is gone.

A worker takes a stage's (or a job's) message from the broker and, at once, names itself on the row
that is still queued (`message_claim`, from workers/orchestration/claims.py), with a claim that lapses after
CLAIM_SECONDS; starting the stage replaces the claim with the running stage's lease. A worker killed
between the two (the message in Redis's `unacked` hash, which gives it back only after its visibility
timeout) leaves a queued row claimed by a dead worker: `claims_reconcile` sees it, in every worker's
reconciler, within a minute of that worker's last heartbeat, and hands the stage to the queue again.

A broker that comes back empty (Redis restarted without its append-only file) forgets every message
it held, claimed or not: `broker_forgot_messages` sees that from a mark the reconcilers keep in it,
and every queued stage and job that was handed over is sent again; the mark is set again only once
that is committed, so a database away at the same moment (a host reboot) only delays it.

Sending too often is safe: a stage starts only from queued (stage_services.stage_start), so a second
copy of a message finds its stage running or done and is dropped.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.fleet.models import Worker
from runs.fleet.selectors import heartbeat_seconds
from runs.pipeline.models import PendingEnqueue
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.dispatch.queue import (EVALUATION_TASK, JOB_TASK, SHARD_TASK, STAGE_TASK, evaluation_enqueue,
                                 job_enqueue, pipeline_enqueue, run_next_stage, shard_enqueue)
from runs.pipeline.shards.models import StageShard
from runs.pipeline.lifecycle.stages import JOBS, STAGES, STAGES_BY_NAME, StageKind

logger = logging.getLogger(__name__)

# A claimed message starts within a second (one message per free pool slot: prefetch 1, acks late);
# past this the reconcilers ask whether its worker is still alive.
CLAIM_SECONDS = 10
# The key the reconcilers keep in the broker's Redis; missing, the broker is new or lost its data.
BROKER_MARK_KEY = "eagle3web:broker-mark"
# Held by the one reconciler sending a forgotten broker's messages again; it lapses by itself if
# that reconciler dies mid-way, so another one sends them then. (Sending twice costs nothing.)
BROKER_RESENDING_KEY = "eagle3web:broker-resending"
RESENDING_SECONDS = 60


def _claimable_rows(task_name: str, args: list | tuple):
    """The queued row a task's message stands for, as a queryset (None for a task that runs no row)."""
    try:
        if task_name == STAGE_TASK:
            stage_name, run_id = args
            return STAGES_BY_NAME[stage_name].model.objects.filter(run_id=int(run_id))
        if task_name == JOB_TASK:
            job_name, record_id = args
            return STAGES_BY_NAME[job_name].model.objects.filter(pk=int(record_id))
        if task_name == SHARD_TASK:  # one shard of a stage (runs.pipeline.shards.services)
            stage_name, record_id, index = args
            return StageShard.objects.filter(stage=str(stage_name), record_id=int(record_id), index=int(index))
        if task_name == EVALUATION_TASK:
            (evaluation_id,) = args
            return STAGES_BY_NAME["evaluate"].model.objects.filter(pk=int(evaluation_id))
    except (KeyError, TypeError, ValueError):
        return None  # not a message of ours; the task itself refuses it
    return None


def message_claim(*, task_name: str, args: list | tuple, worker: str) -> bool:
    """`worker` took the message of a queued stage or job: say so on its row. False when the row is
    not queued (a copy of a message whose stage already runs or ran) or not ours."""
    rows = _claimable_rows(task_name, args)
    if rows is None:
        return False
    return bool(rows.filter(status=StageStatus.QUEUED).update(
        worker=worker[:200], lease_expires_at=timezone.now() + timedelta(seconds=CLAIM_SECONDS)))


def message_claim_drop(*, task_name: str, args: list | tuple, worker: str) -> None:
    """`worker` took the message but will not run it (its stage waits for an earlier one): the row
    is no longer its (the hand-over of the earlier stage sends the message again)."""
    rows = _claimable_rows(task_name, args)
    if rows is not None:
        rows.filter(status=StageStatus.QUEUED, worker=worker[:200]).update(worker="", lease_expires_at=None)


def claimer_alive(name: str, claimed_at: datetime, now: datetime) -> bool:
    """The worker that claimed at `claimed_at` still runs: it heartbeats, it did not say it stopped,
    and it has not started again since (a restarted worker keeps its name and forgets its messages).
    A heartbeat a few seconds late counts as a death: sending a message twice costs nothing."""
    since = now - timedelta(seconds=heartbeat_seconds() + 5)
    return Worker.objects.filter(name=name, stopped_at__isnull=True, last_seen__gte=since,
                                 started_at__lte=claimed_at).exists()


def _send_again(kind: StageKind, row) -> None:
    if kind.is_job:
        job_enqueue(job_name=kind.name, record_id=row.pk)
    elif getattr(row, "run_id", None) is not None:
        pipeline_enqueue(run_id=row.run_id)
    else:
        evaluation_enqueue(evaluation_id=row.pk)


def _note(row, line: str, now: datetime) -> str:
    """The row's log with `line` added: what happened to a stage is shown on its page, not only logged."""
    tail = f"{row.log_tail}\n" if row.log_tail else ""
    return f"{tail}{timezone.localtime(now):%H:%M:%S} {line}"[-20000:]


def claims_reconcile() -> list[str]:
    """Queued rows claimed by a worker that died before starting them: clear the claim and send the
    message again. A live claimer's lapsed claim is renewed (its message waits for a free slot).
    Safe from every worker at once. Returns what it did, in words."""
    now = timezone.now()
    done = []
    for kind in (*STAGES, *JOBS):
        lapsed = kind.model.objects.filter(status=StageStatus.QUEUED, lease_expires_at__lt=now).exclude(worker="")
        for pk in lapsed.values_list("pk", flat=True):
            with transaction.atomic():
                row = kind.model.objects.select_for_update(skip_locked=True).filter(
                    pk=pk, status=StageStatus.QUEUED, lease_expires_at__lt=now).exclude(worker="").first()
                if row is None:
                    continue
                claimed_at = row.lease_expires_at - timedelta(seconds=CLAIM_SECONDS)
                if claimer_alive(row.worker, claimed_at, now):
                    kind.model.objects.filter(pk=pk).update(lease_expires_at=now + timedelta(seconds=CLAIM_SECONDS))
                    continue
                line = (f"worker {row.worker} took this {'job' if kind.is_job else 'stage'}'s message and was lost "
                        "before starting it (no heartbeat since); sent to the queue again")
                kind.model.objects.filter(pk=pk).update(worker="", lease_expires_at=None,
                                                        log_tail=_note(row, line, now))
                _send_again(kind, row)
                done.append(f"{kind.name} {pk}: {line}")
    for line in done:
        logger.warning("reconciled: %s", line)
    return done


def _outside_outbox(rows, kind_name: str, field: str = "pk"):
    return rows.exclude(**{f"{field}__in": PendingEnqueue.objects.filter(kind=kind_name).values_list("object_id", flat=True)})


def _messages_owed() -> list[tuple[str, object]]:
    """(what, how to send it) for every queued row the broker should hold a message for: not waiting
    in the outbox, not a run its sweep holds back or one trained elsewhere, not a stage behind an
    unfinished one."""
    owed = []
    for kind in JOBS:
        queued = _outside_outbox(kind.model.objects.filter(status=StageStatus.QUEUED), kind.name)
        owed += [(f"{kind.name} {pk}", lambda k=kind.name, pk=pk: job_enqueue(job_name=k, record_id=pk))
                 for pk in queued.values_list("pk", flat=True)]
    evaluations = STAGES_BY_NAME["evaluate"].model.objects.filter(status=StageStatus.QUEUED, run__isnull=True)
    owed += [(f"evaluate {pk}", lambda pk=pk: evaluation_enqueue(evaluation_id=pk))
             for pk in _outside_outbox(evaluations, PendingEnqueue.Kind.EVALUATION).values_list("pk", flat=True)]
    for kind in STAGES:
        queued = kind.model.objects.filter(status=StageStatus.QUEUED, run__isnull=False, run__external=False).filter(
            Q(run__sweep_entry__isnull=True) | Q(run__sweep_entry__released_at__isnull=False))
        for run_id in _outside_outbox(queued, PendingEnqueue.Kind.PIPELINE, "run_id").values_list("run_id", flat=True):
            if run_next_stage(run_id=run_id) == kind.name:
                owed.append((f"{kind.name} of run {run_id}", lambda run_id=run_id: pipeline_enqueue(run_id=run_id)))
    # A sharded stage's queued shards, while the stage runs (a failed or cancelled one's wait for Retry).
    for shard in _outside_outbox(StageShard.objects.filter(status=StageStatus.QUEUED), PendingEnqueue.Kind.SHARD):
        if STAGES_BY_NAME[shard.stage].model.objects.filter(pk=shard.record_id, status=StageStatus.RUNNING).exists():
            owed.append((str(shard), lambda pk=shard.pk: shard_enqueue(shard_id=pk)))
    return owed


def broker_forgot_messages(client) -> list[str]:
    """`client`: the broker's Redis. When the mark the reconcilers keep there is gone (the broker is
    new, or restarted without its data), send every handed-over queued stage's and job's message
    again, then set the mark. One reconciler does it at a time (it holds BROKER_RESENDING_KEY for
    RESENDING_SECONDS); the others find the key or the mark set and send nothing.

    The mark is set only once the messages are committed to the outbox: a database that raises
    meanwhile (a host that rebooted, Redis and PostgreSQL both) leaves the mark unset, and the next
    tick that reaches the database sends them. (Marked first, such a failure lost them for good.)"""
    if client.exists(BROKER_MARK_KEY):
        return []
    if not client.set(BROKER_RESENDING_KEY, timezone.now().isoformat(), nx=True, ex=RESENDING_SECONDS):
        return []  # another reconciler is sending them now
    try:
        if client.exists(BROKER_MARK_KEY):
            return []  # another one sent them between our two looks
        with transaction.atomic():
            owed = _messages_owed()
            for _, send in owed:
                send()  # an outbox row each, delivered when this commits
        client.set(BROKER_MARK_KEY, timezone.now().isoformat())
    finally:
        client.delete(BROKER_RESENDING_KEY)  # a Redis gone again lets it lapse instead
    done = [what for what, _ in owed]
    if done:
        logger.warning("the broker came back without its messages: sent again %s", ", ".join(done))
    return [f"the broker lost its messages: sent again {', '.join(done)}"] if done else []
