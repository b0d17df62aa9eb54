"""Running a stage split into shards (issue 36): the planner that the stage's own task calls, the task that
runs one shard, and the merge the last shard's worker does. runs.pipeline.shards.services says how the
rows move; workers.orchestration.shard_runners which stages split and how.

No worker waits for another: the stage's task plans the shards and returns (its pool slot is free at
once: two one-slot workers that each waited for the other's shard would never finish), and the merge is
done by whichever worker ends the last shard.
"""
from __future__ import annotations

import logging
import shutil
import threading

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections, connection

from eagle3web.db import db_retry
from runs.fleet.selectors import workers_live
from runs.pipeline.dispatch.queue import stage_row_queue
from runs.pipeline.shards.services import (
    shard_fail,
    shard_heartbeat,
    shard_progress,
    shard_start,
    shard_succeed,
    shards_plan,
    shards_resume,
)
from runs.pipeline.shards.rows import shards_of
from runs.pipeline.lifecycle.stage_services import HAND_OVER_NEXT, StageCancelled, stage_fail
from runs.pipeline.lifecycle.stages import STAGES_BY_NAME
from runs.models import StageAttempt, StageStatus
from workers.contract.errors import StopRequested
from workers.contract.failures import failure_explain, trace_for_developers
from workers.orchestration.shard_runners import SHARDABLE
from workers.orchestration.stage_runners import RECORDERS, StageReporter, failure_context
from workers.stages.shards import shards_default

logger = logging.getLogger(__name__)


def shards_wanted(*, stage_name: str, record) -> int:
    """The run's `shards` (a regeneration's own), or left out: one per live worker that takes the stage's queue, at most
    one per 64 rows (workers.stages.shards.shards_default)."""
    run = getattr(record, "run", None)
    # A run's stage: the run's setting; a job (a regeneration): its own row's.
    asked = (run.config or {}).get("shards") if run is not None else getattr(record, "shards", None)
    if asked:
        return int(asked)
    queue = stage_row_queue(stage_name=stage_name, record_id=record.pk)
    live = sum(1 for queues in workers_live().values_list("queues", flat=True) if queue in (queues or []))
    return shards_default(total_rows=SHARDABLE[stage_name].rows(record), live_workers=live)


def stage_shards_start(*, stage_name: str, record, worker: str) -> bool | None:
    """Called by the worker that started a stage: None to run it here, whole, as always (one shard, or a
    stage that does not split); else the stage is in shards' hands and this returns at once. A stage that
    has shards (Retry, or its merging worker was lost) sends those that did not succeed, or merges when
    every one did; a stage's first attempt decides whether it splits, and a later one keeps that choice
    (an earlier whole attempt's folder holds its work)."""
    spec = SHARDABLE.get(stage_name)
    if spec is None or not spec.applies(record):
        return None
    if shards_of(stage_name=stage_name, record_id=record.pk).exists():
        if not shards_of(stage_name=stage_name, record_id=record.pk).exclude(status=StageStatus.SUCCEEDED).exists():
            return stage_merge(stage_name=stage_name, record_id=record.pk, worker=worker)
        sent = db_retry("resume shards", shards_resume, stage_name=stage_name, record_id=record.pk)
        logger.info("%s %s: shards %s sent again; those that succeeded are kept", stage_name, record.pk, sent)
        return True
    if StageAttempt.objects.filter(stage=stage_name, record_id=record.pk).count() > 1:
        return None
    wanted = shards_wanted(stage_name=stage_name, record=record)
    if wanted <= 1:
        return None
    spans = spec.spans_for(record, wanted)
    if len(spans) <= 1:
        return None
    budget = spec.batch_tokens(record) if spec.batch_tokens else None
    db_retry("plan shards", shards_plan, stage_name=stage_name, record_id=record.pk, spans=spans, batch_tokens=budget)
    logger.info("%s %s split into %d shards: %s", stage_name, record.pk, len(spans),
                ", ".join(f"rows {s.start}-{s.stop - 1}" for s in spans))
    return True


class ShardReporter(StageReporter):
    """A StageReporter whose progress and log go to one shard's row."""

    def __init__(self, *, stage_name: str, record_id: int, index: int, started_at, prefix: str):
        super().__init__(stage_name=stage_name, record_id=record_id, interval=settings.EAGLE3WEB_PROGRESS_INTERVAL,
                         started_at=started_at)
        self.index, self.prefix = index, prefix

    def progress(self, done: int, total: int) -> None:
        import time

        self.done, self.total = done, total
        now = time.monotonic()
        if now - self._last_write >= self.interval or done >= total:
            self._last_write = now
            db_retry("shard progress", shard_progress, stage_name=self.stage_name, record_id=self.record_id,
                     index=self.index, started_at=self.started_at, rows_done=done, log_tail=self.tail,
                     prefix=self.prefix)

    @property
    def shard_tail(self) -> str:
        return f"{self.prefix}\n{self.tail}" if self.prefix else self.tail


class ShardHeartbeat(threading.Thread):
    """Renews the shard's lease and its stage's while the shard works (see workers.orchestration.tasks.Heartbeat)."""

    def __init__(self, **args):
        super().__init__(name=f"heartbeat-shard-{args['stage_name']}-{args['record_id']}-{args['index']}", daemon=True)
        self.args, self.stopped = args, threading.Event()

    def run(self) -> None:
        period = max(0.5, settings.EAGLE3WEB_STAGE_LEASE_SECONDS / 3)
        try:
            while not self.stopped.wait(period):
                try:
                    if not shard_heartbeat(**self.args):
                        return
                except Exception:  # noqa: BLE001 - the database may be away for a while; keep trying
                    logger.warning("heartbeat of %s could not renew its lease", self.args, exc_info=True)
                    close_old_connections()
        finally:
            connection.close()


def _attach(reporter) -> list[logging.Logger]:
    watched = [logging.getLogger("workers"), logging.getLogger("speculators")]
    for log in watched:
        log.addHandler(reporter)
        log.setLevel(logging.INFO)
    return watched


def shard_execute(*, stage_name: str, record_id: int, index: int, worker: str) -> bool:
    """Run one shard; True if it succeeded. Its failure fails the stage; its success may merge the stage."""
    shard = db_retry("start shard", shard_start, stage_name=stage_name, record_id=record_id, index=index,
                     worker=worker)
    if shard is None:
        logger.info("shard %s of %s %s is not queued any more (or its stage ended); skipping", index, stage_name,
                    record_id)
        return False
    fence = shard.started_at
    reporter = ShardReporter(stage_name=stage_name, record_id=record_id, index=index, started_at=fence,
                             prefix=shard.log_tail)
    heartbeat = ShardHeartbeat(stage_name=stage_name, record_id=record_id, index=index, started_at=fence)
    heartbeat.start()
    import torch

    torch.set_num_threads(settings.EAGLE3WEB_TORCH_THREADS)
    watched = _attach(reporter)
    kind, record = STAGES_BY_NAME[stage_name], None
    try:
        related = () if kind.is_job else ("run__target", "run__dataset")
        record = db_retry("load", kind.model.objects.select_related(*related).get, pk=record_id)
        logger.info("shard %d (%s) of %s %s started on %s", index, shard.span_label, stage_name, record_id, worker)
        result = SHARDABLE[stage_name].run_shard(record, reporter, index, range(shard.row_start, shard.row_stop),
                                                 shard.batch_tokens)
        logger.info("shard %d of %s %s finished", index, stage_name, record_id)
        merge_due = db_retry("shard result", shard_succeed, stage_name=stage_name, record_id=record_id, index=index,
                             started_at=fence, result=result, log_tail=reporter.shard_tail)
    except (StageCancelled, StopRequested) as exc:
        logger.info("%s", exc)
        db_retry("shard cancel", shard_fail, stage_name=stage_name, record_id=record_id, index=index,
                 started_at=fence, error=str(exc), log_tail=reporter.shard_tail, cancelled=True)
        return False
    except Exception as exc:  # noqa: BLE001 - every failure must reach the page
        logger.exception("shard %d of %s %s failed", index, stage_name, record_id)
        failure = failure_explain(exc, stage_name=stage_name, context=failure_context(record, kind))
        db_retry("shard failure", shard_fail, stage_name=stage_name, record_id=record_id, index=index,
                 started_at=fence, error=failure.sentence, failure=failure, trace=trace_for_developers(exc),
                 log_tail=reporter.shard_tail)
        return False
    finally:
        heartbeat.stopped.set()
        for log in watched:
            log.removeHandler(reporter)
    if merge_due:
        return stage_merge(stage_name=stage_name, record_id=record_id, worker=worker)
    return True


def stage_merge(*, stage_name: str, record_id: int, worker: str) -> bool:
    """Every shard succeeded: put their outputs together and record the stage's result, which hands the
    run to its next stage as a whole stage's success does. A merge that fails fails the stage (Retry
    merges again: the shards' outputs are kept)."""
    kind = STAGES_BY_NAME[stage_name]
    related = () if kind.is_job else ("run__target", "run__dataset")
    record = db_retry("load", kind.model.objects.select_related(*related).get, pk=record_id)
    fence = record.started_at
    reporter = StageReporter(stage_name=stage_name, record_id=record_id, interval=settings.EAGLE3WEB_PROGRESS_INTERVAL,
                             started_at=fence)
    watched = _attach(reporter)
    handing_over = HAND_OVER_NEXT.set(True)
    shards = list(shards_of(stage_name=stage_name, record_id=record_id))
    try:
        logger.info("merging the %d shards of %s %s on %s", len(shards), stage_name, record_id, worker)
        result = SHARDABLE[stage_name].merge(record, shards, reporter)
        logger.info("merged the %d shards of %s %s", len(shards), stage_name, record_id)
        log_tail = f"{record.log_tail}\n{reporter.tail}" if record.log_tail else reporter.tail
        db_retry("result", RECORDERS[stage_name], record_id=record_id, result=result, log_tail=log_tail,
                 started_at=fence)
        parts_remove(SHARDABLE[stage_name], record)
        return True
    except StageCancelled as exc:
        logger.info("%s", exc)
        return False
    except Exception as exc:  # noqa: BLE001 - every failure must reach the page
        logger.exception("merging the shards of %s %s failed", stage_name, record_id)
        failure = failure_explain(exc, stage_name=stage_name, context=failure_context(record, kind))
        db_retry("failure", stage_fail, stage_name=stage_name, record_id=record_id,
                 error=f"merging its {len(shards)} shards failed on {worker}: {failure.sentence}", failure=failure,
                 trace=trace_for_developers(exc), log_tail=f"{record.log_tail}\n{reporter.tail}", started_at=fence)
        return False
    finally:
        HAND_OVER_NEXT.reset(handing_over)
        for log in watched:
            log.removeHandler(reporter)


def parts_remove(spec, record) -> int:
    """Remove the shards' parts once their merge is recorded (until then Retry may merge them again); the
    bytes freed, which the worker's log says. Their parent goes too when nothing else is in it (an
    evaluation's or a regeneration's folder of its own)."""
    folder = spec.parts(record) if spec.parts else None
    if folder is None or not folder.exists():
        return 0
    freed = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.parent.rmdir()
    except OSError:
        pass  # it holds more than the parts (a run's folder): kept
    logger.info("removed the merged shards' parts %s (%d bytes)", folder, freed)
    return freed


@shared_task(bind=True, name="eagle3web.stage_shard", acks_late=True)
def stage_shard_task(self, stage_name: str, record_id: int, index: int) -> bool:
    if stage_name not in SHARDABLE:
        raise ValueError(f"{stage_name!r} does not split into shards")
    return shard_execute(stage_name=stage_name, record_id=int(record_id), index=int(index),
                         worker=self.request.hostname or "celery")
