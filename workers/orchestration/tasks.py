"""The seam between the queue, the database and the stages.

Each task takes an id, marks its stage row running, calls one pure stage function with plain paths
and a progress callback (through its runner, workers.orchestration.stage_runners), and hands the result to a service.
The same `stage_execute` runs inline for `run_pipeline --inline` and `evaluate_checkpoint`.
"""
from __future__ import annotations

import logging
import threading
import time

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import close_old_connections, connection

from eagle3web.db import db_retry
from runs.alerts import events as alert_events
from runs.alerts.services import delivery_send
from runs.pipeline.lifecycle.stage_services import (
    StageCancelled,
    stage_fail,
    stage_heartbeat,
    stage_record_id,
    stage_start,
    stage_waits_for_previous,
    stages_reconcile,
)
from runs.pipeline.lifecycle.stages import JOB_NAMES, STAGES, STAGES_BY_NAME
from runs.pipeline.dispatch.queue import outbox_flush
from runs.sweeps.release import sweeps_release
from runs.checkpoints.serve_check_selectors import run_serve_checks_queued
import workers.orchestration.fleet  # noqa: F401 - every worker probes its host, takes its GPU queues and heartbeats
from runs.pipeline.dispatch.launch_order import stage_choose
from runs.pipeline.dispatch.message_claims import claims_reconcile, message_claim_drop
from runs.pipeline.lifecycle.stage_services import HAND_OVER_NEXT
from workers.orchestration.claims import broker_mark_check  # also: every worker claims the messages it takes
# also: registers the shards' task (eagle3web.stage_shard)
from workers.orchestration.shard_tasks import stage_shards_start
from runs.pipeline.shards.reconcile import shards_reconcile
from workers.contract.errors import StopRequested
from workers.contract.failures import failure_explain, trace_for_developers
from workers.orchestration.stage_runners import RECORDERS, STAGE_BODIES, StageReporter, failure_context
from workers.orchestration.system_metrics import StageSampler

logger = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Renews the running stage's lease while the stage works, even through long steps that report
    no progress (loading a model, one slow batch); stops when the stage ends or is no longer its."""

    def __init__(self, *, stage_name: str, record_id: int, started_at):
        super().__init__(name=f"heartbeat-{stage_name}-{record_id}", daemon=True)
        self.args = {"stage_name": stage_name, "record_id": record_id, "started_at": started_at}
        self.stopped = threading.Event()

    def run(self) -> None:
        period = max(0.5, settings.EAGLE3WEB_STAGE_LEASE_SECONDS / 3)
        try:
            while not self.stopped.wait(period):
                try:
                    if not stage_heartbeat(**self.args):
                        return  # cancelled, or the stage went to another attempt: progress reports say so
                except Exception:  # noqa: BLE001 - the database may be away for a while; keep trying
                    logger.warning("heartbeat of %s %s could not renew its lease", self.args["stage_name"],
                                   self.args["record_id"], exc_info=True)
                    close_old_connections()
        finally:
            connection.close()


def stage_execute(*, stage_name: str, record_id: int, worker: str, may_shard: bool = False) -> bool:
    """Run one stage row; True if it succeeded (or, `may_shard`, was handed to its shards:
    workers.orchestration.shard_tasks). Failures are recorded, not raised.

    Every write here rides out a locked or unreachable database (eagle3web.db.db_retry): a task that
    raised before marking its row would leave it queued with its message gone, and one that raised
    instead of recording its failure would leave it running until its lease lapsed."""
    started = db_retry("start", stage_start, stage_name=stage_name, record_id=record_id, worker=worker)
    if started is None:
        logger.info("%s %s is not queued any more (or was deleted); skipping", stage_name, record_id)
        return False
    fence = started.started_at
    reporter = StageReporter(stage_name=stage_name, record_id=record_id, interval=settings.EAGLE3WEB_PROGRESS_INTERVAL,
                             started_at=fence)
    # The lease is renewed from here on: importing torch in a fresh pool process can take longer
    # than a short lease, and a lapsed lease hands the stage to another attempt.
    heartbeat = Heartbeat(stage_name=stage_name, record_id=record_id, started_at=fence)
    heartbeat.start()
    kind = STAGES_BY_NAME[stage_name]
    # A run's stage is charted on its run page (CPU, memory, GPU, disk); a job has no run to chart it on.
    sampler = None if kind.is_job else StageSampler(stage_name=stage_name, record_id=record_id)
    if sampler:
        sampler.start()
    watched = [logging.getLogger("workers"), logging.getLogger("speculators")]
    for log in watched:
        log.addHandler(reporter)
        log.setLevel(logging.INFO)
    record = None
    try:
        related = () if kind.is_job else ("run__target", "run__dataset")
        record = db_retry("load", kind.model.objects.select_related(*related).get, pk=record_id)
        if may_shard and (sharded := stage_shards_start(stage_name=stage_name, record=record, worker=worker)) is not None:
            return sharded  # its shards run it, on any worker of its queue; this slot is free again
        # After the split: planning one needs no torch (workers.stages.extract.batch_plan), and importing it
        # took a fresh pool process seconds. A cpu worker runs the jobs without torch.
        if not kind.is_job:
            import torch

            torch.set_num_threads(settings.EAGLE3WEB_TORCH_THREADS)
        logger.info("%s %s started on %s", stage_name, record_id, worker)
        result = STAGE_BODIES[stage_name](record, reporter)
        logger.info("%s %s finished", stage_name, record_id)
        db_retry("result", RECORDERS[stage_name], record_id=record_id, result=result, log_tail=reporter.tail,
                 started_at=fence)
        return True
    except (StageCancelled, StopRequested) as exc:  # a user's cancel: no traceback, not a failure
        logger.info("%s", exc)
        db_retry("cancel", stage_fail, stage_name=stage_name, record_id=record_id, error=str(exc),
                 log_tail=reporter.tail, cancelled=True, started_at=fence)
        return False
    except Exception as exc:  # noqa: BLE001 - every failure must reach the page
        logger.exception("%s %s failed", stage_name, record_id)  # the worker's own log keeps the whole traceback
        failure = failure_explain(exc, stage_name=stage_name, context=failure_context(record, kind))
        db_retry("failure", stage_fail, stage_name=stage_name, record_id=record_id, error=failure.sentence,
                 failure=failure, trace=trace_for_developers(exc), log_tail=reporter.tail, started_at=fence)
        return False
    finally:
        heartbeat.stopped.set()
        if sampler:
            sampler.stop()
        for log in watched:
            log.removeHandler(reporter)


@shared_task(bind=True, name="eagle3web.stage", acks_late=True)
def stage_task(self, stage_name: str, run_id: int) -> bool:
    waiting_for = db_retry("order", stage_waits_for_previous, stage_name=stage_name, run_id=run_id)
    if waiting_for:
        logger.info("%s of run %s waits for %s to succeed; skipping", stage_name, run_id, waiting_for)
        db_retry("unclaim", message_claim_drop, task_name=self.name, args=(stage_name, run_id),
                 worker=self.request.hostname or "")
        return False
    # This message is a turn of its queue: the earliest-launched run's stage waiting there takes it
    # (runs.pipeline.dispatch.launch_order), which is this one's own stage or an earlier run's.
    chosen = db_retry("launch order", stage_choose, stage_name=stage_name, run_id=run_id,
                      worker=self.request.hostname or "celery")
    if chosen is None:
        logger.info("%s of run %s ran already and no stage waits in its queue; skipping", stage_name, run_id)
        return False
    if chosen != (stage_name, run_id):
        logger.info("%s of run %s, the earliest-launched run's stage waiting in this queue, takes the turn of %s of "
                    "run %s", *chosen, stage_name, run_id)
        db_retry("unclaim", message_claim_drop, task_name=self.name, args=(stage_name, run_id),
                 worker=self.request.hostname or "")
        stage_name, run_id = chosen
    record_id = db_retry("lookup", stage_record_id, stage_name=stage_name, run_id=run_id)
    handing_over = HAND_OVER_NEXT.set(True)  # its success sends the run's next stage (stage_succeed)
    try:
        return stage_execute(stage_name=stage_name, record_id=record_id, worker=self.request.hostname or "celery",
                             may_shard=True)
    finally:
        HAND_OVER_NEXT.reset(handing_over)


@shared_task(bind=True, name="eagle3web.train_rank", acks_late=True)
def train_rank_task(self, node_id: int) -> bool:
    """One rank (not 0) of a training across nodes (workers.orchestration.node_runner); its lease is its row's."""
    import torch

    from workers.orchestration.node_runner import rank_execute
    from workers.orchestration.stage_runners import train_plan

    torch.set_num_threads(settings.EAGLE3WEB_TORCH_THREADS)
    return rank_execute(node_id=node_id, worker=self.request.hostname or "celery", plan=train_plan)


@shared_task(bind=True, name="eagle3web.evaluate_checkpoint", acks_late=True)
def evaluation_task(self, evaluation_id: int) -> bool:
    return stage_execute(stage_name="evaluate", record_id=evaluation_id, worker=self.request.hostname or "celery",
                         may_shard=True)


@shared_task(bind=True, name="eagle3web.job", acks_late=True)
def job_task(self, job_name: str, record_id: int) -> bool:
    if job_name not in JOB_NAMES:
        raise ValueError(f"unknown job {job_name!r}")
    return stage_execute(stage_name=job_name, record_id=record_id, worker=self.request.hostname or "celery",
                         may_shard=True)


@shared_task(name="eagle3web.alert_delivery", acks_late=True)
def alert_delivery_task(delivery_id: int) -> str:
    # On the cpu queue (runs.alerts.services.DELIVERY_QUEUE); a failure is retried by the service itself.
    return db_retry("alert delivery", delivery_send, delivery_id=delivery_id)


def pipeline_run_inline(*, run_id: int) -> None:
    for stage in STAGES:
        stage_execute(stage_name=stage.name, record_id=stage_record_id(stage_name=stage.name, run_id=run_id),
                      worker="inline")
    # The serve check a run asked for follows its measurement here too (stage_execute skips one a worker took).
    for check_id in run_serve_checks_queued(run_id=run_id):
        stage_execute(stage_name="serve_check", record_id=check_id, worker="inline")


class Reconciler(threading.Thread):
    """Every few seconds, hands stages whose worker was lost back to the queue: running ones whose
    lease lapsed (stages_reconcile), queued ones whose message a dead worker took (claims_reconcile), the
    shards of split stages in either case (shards_reconcile),
    those a broker restarted empty forgot (broker_mark_check), and what the outbox holds. Each worker
    runs one, from its start, so lost work is found within about a lease, a lost message within a
    minute of its worker's last heartbeat, and an outage's hand-overs within seconds of its end."""

    def __init__(self):
        super().__init__(name="stage-reconciler", daemon=True)

    def run(self) -> None:
        period = max(1.0, min(10.0, settings.EAGLE3WEB_STAGE_LEASE_SECONDS / 2))
        while True:
            try:
                close_old_connections()
                stages_reconcile()
                claims_reconcile()
                shards_reconcile()  # shards whose worker was lost, as the two above for stages
                sweeps_release()  # a sweep's next run, where a finished run's hand-over was missed
                outbox_flush()  # what a broker outage kept from the queue
                broker_mark_check()
                alert_events.reconcile()  # stalled stages; alert deliveries whose message was lost
            except Exception:  # noqa: BLE001 - a database or broker away for a while: try again later
                logger.warning("reconciling stages failed; trying again in %.0f s", period, exc_info=True)
            time.sleep(period)


@worker_ready.connect
def _start_reconciler(**_kwargs) -> None:
    Reconciler().start()
