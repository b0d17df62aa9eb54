"""The seam between the queue, the database and the stages.

Each task takes an id, marks its stage row running, calls one pure stage function with plain paths
and a progress callback, and hands the result to a service. The same `stage_execute` runs inline
for `run_pipeline --inline` and `evaluate_checkpoint`.
"""
from __future__ import annotations

import collections
import logging
import shutil
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import close_old_connections, connection

from eagle3web.db import db_retry
from runs.alerts import events as alert_events
from runs.alerts.services import delivery_send
from runs.data.curation import dataset_exclusions, dataset_samples_sync
from runs.data.extractions import extraction_verify
from runs.data.regeneration import regeneration_record
from runs.checkpoints.evaluation import evaluation_plan
from runs.tracking.services import metrics_record
from runs.models import Evaluation, StageRecord
from runs.pipeline.stage_services import (
    STAGE_RECORDERS,
    StageCancelled,
    measured_alongside_record,
    checkpoints_register,
    stage_fail,
    stage_progress,
    stage_heartbeat,
    stage_record_id,
    stage_start,
    stage_waits_for_previous,
    stages_reconcile,
    training_resume,
    training_split_record,
)
from runs.pipeline.stages import JOB_NAMES, STAGES, STAGES_BY_NAME
from runs.pipeline.queue import outbox_flush
from runs.sweeps.release import sweeps_release
from runs.pipeline.routing import stage_backend
from runs.pipeline import online as online_run
from workers.online_tasks import hidden_states_dir as _hidden_states_dir, online_source as _online_source
from runs.checkpoints.serve_check_selectors import run_serve_checks_queued
import workers.fleet  # noqa: F401 - every worker probes its host, takes its GPU queues and heartbeats
from runs.pipeline.message_claims import claims_reconcile, message_claim_drop
from runs.pipeline.stage_services import HAND_OVER_NEXT
from workers.claims import broker_mark_check  # also: every worker claims the messages it takes
from workers.contract.errors import StopRequested
from workers.system_metrics import StageSampler

logger = logging.getLogger(__name__)


class StageReporter(logging.Handler):
    """Collects the stage's log lines and writes progress at most every few seconds."""

    def __init__(self, *, stage_name: str, record_id: int, interval: float, started_at=None):
        super().__init__(level=logging.INFO)
        self.stage_name, self.record_id, self.interval = stage_name, record_id, interval
        self.started_at = started_at  # which attempt this is: a replaced attempt can no longer write
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        self._last_write = 0.0
        self.done, self.total = 0, 0

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    @property
    def tail(self) -> str:
        return "\n".join(self.lines)

    def progress(self, done: int, total: int) -> None:
        """Raises StageCancelled when the user cancelled the stage, which stops the stage's loop."""
        self.done, self.total = done, total
        now = time.monotonic()
        if now - self._last_write >= self.interval or done >= total:
            self._last_write = now
            db_retry("progress", stage_progress, stage_name=self.stage_name, record_id=self.record_id,
                     done=done, total=total, log_tail=self.tail, started_at=self.started_at)

    def cancelled(self) -> bool:
        try:
            self.progress(self.done, self.total)
        except StageCancelled:
            return True
        return False


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


def _fresh_dir(path: Path) -> Path:
    """A retried prepare starts over (it is cheap, and writes its folder at once): what an earlier,
    failed attempt left in the run's folder goes."""
    if path.exists():
        shutil.rmtree(path)
    return path


def _resumable_dir(path: Path, *, marker: str) -> Path:
    """A retried stage resumes in its folder when an earlier attempt marked it (the stage itself
    judges what can be kept); a folder without the mark (an older version's) starts over."""
    if path.exists() and not (path / marker).exists():
        shutil.rmtree(path)
    return path


def _prepare(record, reporter: StageReporter):
    from workers.stages.prepare import prepare

    run = record.run
    excluded = dataset_exclusions(dataset=run.dataset)
    return prepare(
        tokenizer_dir=Path(run.target.path),
        dataset_path=Path(run.dataset.path),
        out_dir=_fresh_dir(Path(run.output_dir) / "prepared"),
        max_seq_len=run.config["max_seq_len"],
        max_samples=run.config.get("max_samples"),
        exclude_ids=excluded.ids,
        exclude_hashes=excluded.hashes,
        exclude_own_ids=excluded.own_ids,
        on_progress=reporter.progress,
    )


def _backend(run, stage_name: str) -> tuple[str, int]:
    """The run's backend and GPU count for this stage, refused (naming both and why) on a worker
    that cannot run them: routing sends them elsewhere, so this only catches a misrouted message."""
    from workers.contract.backends import backend_require

    backend, gpus = stage_backend(stage_name=stage_name, config=run.config or {})
    backend_require(name=backend, gpus=gpus)
    return backend, gpus


def _extract(record, reporter: StageReporter):
    from workers.stages.extract.resume import RESUME_NAME

    run = record.run
    if online_run.is_online(run.config):
        return online_run.online_extract(run=run)  # training captures the hidden states; nothing to extract
    backend, gpus = _backend(run, "extract")
    common = dict(target_dir=Path(run.target.path), prepared_dir=Path(run.preparation.out_dir),
                  out_dir=_resumable_dir(Path(run.output_dir) / "extraction", marker=RESUME_NAME),
                  layer_ids=record.layer_ids, on_progress=reporter.progress)
    if backend == "vllm":
        from workers.contract.backends import vllm_executable
        from workers.stages.extract.with_vllm import extract_with_vllm

        return extract_with_vllm(**common, tensor_parallel_size=gpus, vllm_executable=vllm_executable(),
                                 should_stop=reporter.cancelled)
    from workers.stages.extract.with_transformers import extract

    return extract(**common, num_gpus=gpus, batch_tokens=settings.EAGLE3WEB_EXTRACT_BATCH_TOKENS or None)


def _vocab(record, reporter: StageReporter):
    from workers.contract.speculators_layout import run_data_link
    from workers.stages.vocab import build_vocab

    run = record.run
    result = build_vocab(
        token_freq_path=Path(run.preparation.token_freq_path),
        out_dir=Path(run.output_dir) / "vocab",
        draft_vocab_size=record.draft_vocab_size,
        target_vocab_size=record.target_vocab_size,
        on_progress=reporter.progress,
    )
    # Every run's folder then holds `speculators_data/`, which `speculators train --data-path` reads as is.
    run_data_link(run_dir=Path(run.output_dir), prepared_dir=Path(run.preparation.out_dir),
                  hidden_states_dir=_hidden_states_dir(run), d2t_path=result.d2t_path, t2d_path=result.t2d_path)
    return result


def _train(record, reporter: StageReporter):
    run = record.run
    backend, gpus = _backend(run, "train")
    options = dict(val_fraction=run.config.get("val_fraction", 0.1),
                   max_tokens_per_step=run.config.get("max_tokens_per_step"))
    if (online := _online_source(run)) is not None:
        options["online"] = online  # the loop reads the cache and asks the capture servers for the rest
    if backend == "speculators":
        from workers.stages.train.with_speculators.trainer import train_with_speculators as trainer

        options.update(num_gpus=gpus, extra_args=settings.EAGLE3WEB_SPECULATORS_ARGS)
    else:
        from workers.stages.train.loop import train as trainer
    return trainer(
        **options,
        target_dir=Path(run.target.path),
        prepared_dir=Path(run.preparation.out_dir),
        hidden_states_dir=_hidden_states_dir(run),
        d2t_path=Path(run.vocab_mapping.d2t_path),
        t2d_path=Path(run.vocab_mapping.t2d_path),
        out_dir=Path(run.output_dir) / "checkpoints",
        # An online run has no extraction: the layers its stage row planned (with the final one) are asked for.
        layer_ids=run.extract_stage.layer_ids if online else run.extract_stage.extraction.layer_ids,
        epochs=record.epochs,
        lr=record.lr,
        ttt_steps=record.ttt_steps,
        draft_vocab_size=run.vocab_mapping.draft_vocab_size,
        seed=run.config.get("seed", 0),
        on_progress=reporter.progress,
        on_metrics=lambda points: db_retry("metrics", metrics_record, training_run_id=record.pk, points=points),
        should_stop=reporter.cancelled,
        on_checkpoint=lambda c: db_retry("checkpoint", checkpoints_register, training_run_id=record.pk,
                                         checkpoints=[asdict(c)]),
        # resumes from the state an earlier attempt saved in out_dir; what it reported later goes
        on_split=lambda split: db_retry("split", training_split_record, training_run_id=record.pk, split=split,
                                        started_at=reporter.started_at),
        on_resume=lambda step, epochs_done: db_retry("resume", training_resume, training_run_id=record.pk, step=step,
                                                     epochs_done=epochs_done, started_at=reporter.started_at),
    )


def _evaluate(record: Evaluation, reporter: StageReporter):
    from workers.stages.evaluate.measure import evaluate
    from workers.stages.evaluate.prompts import prompts_load

    # A run's stage loads the target on its extraction's GPU count (runs.pipeline.routing sent it to the queue
    # of Transformers on that many); a standalone evaluation, sent to "gpu", and a run from before
    # GPU counts (no key: the default, 1) on one device.
    num_gpus = 1
    if record.run_id is not None:
        _, num_gpus = stage_backend(stage_name="evaluate", config=record.run.config or {})
        if num_gpus != 1:
            _backend(record.run, "evaluate")  # refused here, naming why, on a worker that cannot spread it
    plan = evaluation_plan(evaluation=record)
    common = dict(target_dir=plan.target_dir, prompts=prompts_load(plan.prompts), prompt_source=plan.prompt_source,
                  max_new_tokens=record.max_new_tokens, num_speculative_tokens=record.num_speculative_tokens,
                  num_gpus=num_gpus, should_stop=reporter.cancelled)
    # One progress over every checkpoint measured (prompts x checkpoints), said from the start: the page showed
    # "–" until the last checkpoint began, then counted that one's prompts alone.
    per = max(1, len(common["prompts"]))
    total = per * (len(plan.also) + 1)
    reporter.progress(0, total)

    def progress_of(index: int):
        return lambda done, _of: reporter.progress(index * per + done, total)

    # Recorded with this measurement's settings: a serve check of one of them derives its prompts from them.
    for index, (checkpoint_id, path) in enumerate(plan.also):
        db_retry("evaluation", measured_alongside_record, measured=record, checkpoint_id=checkpoint_id,
                 result=evaluate(checkpoint_dir=path, on_progress=progress_of(index), **common))
    return evaluate(checkpoint_dir=plan.checkpoint_dir, on_progress=progress_of(len(plan.also)), **common)


def _catalogue(record, reporter: StageReporter):
    return dataset_samples_sync(dataset=record.dataset, on_progress=reporter.progress)


def _verify(record, reporter: StageReporter):
    return extraction_verify(extraction=record.extraction, full=record.full, on_progress=reporter.progress,
                             requested_by=record.requested_by)


def _serve_check(record, reporter: StageReporter):
    from runs.checkpoints.serve_check_services import serve_check_plan
    from workers.contract.backends import vllm_executable
    from workers.stages.evaluate.prompts import prompts_load
    from workers.stages.evaluate.serve_check import serve_check

    plan = serve_check_plan(check=record)
    return serve_check(target_dir=plan.target_dir, checkpoint_dir=plan.checkpoint_dir,
                       prompts=plan.prompts_checked(prompts_load(plan.prompts)),
                       max_new_tokens=plan.max_new_tokens, num_speculative_tokens=plan.num_speculative_tokens,
                       tensor_parallel_size=record.tensor_parallel_size, vllm_executable=vllm_executable(),
                       out_dir=Path(settings.EAGLE3WEB_RUNS_DIR) / "serve_checks" / str(record.pk),
                       on_progress=reporter.progress, should_stop=reporter.cancelled)


def _regenerate(record, reporter: StageReporter):
    from runs.data.regeneration import regeneration_plan
    from workers.contract.backends import vllm_executable
    from workers.stages.regenerate import RegenerateSettings, regenerate

    plan = regeneration_plan(job=record)
    if record.backend == "transformers":  # jobs skip torch's thread setting; this one runs a model here
        import torch

        torch.set_num_threads(settings.EAGLE3WEB_TORCH_THREADS)
    return regenerate(
        target_dir=plan.target_dir, source_path=plan.source_path, out_path=plan.output_path, backend=record.backend,
        settings=RegenerateSettings(max_new_tokens=record.max_new_tokens, temperature=record.temperature,
                                    seed=record.seed, max_samples=record.max_samples),
        exclude_ids=plan.exclude_ids, exclude_hashes=plan.exclude_hashes, exclude_own_ids=plan.exclude_own_ids,
        vllm_executable=vllm_executable() if record.backend == "vllm" else None,
        tensor_parallel_size=record.tensor_parallel_size,
        work_dir=Path(settings.EAGLE3WEB_RUNS_DIR) / "regenerations" / str(record.pk),
        on_progress=reporter.progress, should_stop=reporter.cancelled)


# What each stage's (and job's) worker records once it succeeded. The regeneration's recorder lives with
# its service (runs.data.regeneration), which itself records through runs.pipeline.stage_services.
RECORDERS = {**STAGE_RECORDERS, "regenerate": regeneration_record}


# Each runs one stage (or job) for its row and returns the stage's result dataclass.
STAGE_BODIES: dict[str, Callable[[StageRecord, StageReporter], object]] = {
    "prepare": _prepare,
    "extract": _extract,
    "vocab": _vocab,
    "train": _train,
    "evaluate": _evaluate,
    "catalogue": _catalogue,
    "verify": _verify,
    "serve_check": _serve_check,
    "regenerate": _regenerate,
}


def stage_execute(*, stage_name: str, record_id: int, worker: str) -> bool:
    """Run one stage row; True if it succeeded. Failures are recorded, not raised.

    Every write here rides out a locked or unreachable database (eagle3web.db.db_retry): a task that
    raised before marking its row would leave it queued with its message gone, and one that raised
    instead of recording its failure would leave it running until its lease lapsed."""
    started = db_retry("start", stage_start, stage_name=stage_name, record_id=record_id, worker=worker)
    if started is None:
        logger.info("%s %s is not queued any more; skipping", stage_name, record_id)
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
    if not kind.is_job:  # a cpu worker runs the jobs without torch
        import torch

        torch.set_num_threads(settings.EAGLE3WEB_TORCH_THREADS)
    watched = [logging.getLogger("workers"), logging.getLogger("speculators")]
    for log in watched:
        log.addHandler(reporter)
        log.setLevel(logging.INFO)
    try:
        related = () if kind.is_job else ("run__target", "run__dataset")
        record = db_retry("load", kind.model.objects.select_related(*related).get, pk=record_id)
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
        logger.exception("%s %s failed", stage_name, record_id)
        error = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
        db_retry("failure", stage_fail, stage_name=stage_name, record_id=record_id, error=error,
                 log_tail=reporter.tail, started_at=fence)
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
    record_id = db_retry("lookup", stage_record_id, stage_name=stage_name, run_id=run_id)
    handing_over = HAND_OVER_NEXT.set(True)  # its success sends the run's next stage (stage_succeed)
    try:
        return stage_execute(stage_name=stage_name, record_id=record_id, worker=self.request.hostname or "celery")
    finally:
        HAND_OVER_NEXT.reset(handing_over)


@shared_task(bind=True, name="eagle3web.evaluate_checkpoint", acks_late=True)
def evaluation_task(self, evaluation_id: int) -> bool:
    return stage_execute(stage_name="evaluate", record_id=evaluation_id, worker=self.request.hostname or "celery")


@shared_task(bind=True, name="eagle3web.job", acks_late=True)
def job_task(self, job_name: str, record_id: int) -> bool:
    if job_name not in JOB_NAMES:
        raise ValueError(f"unknown job {job_name!r}")
    return stage_execute(stage_name=job_name, record_id=record_id, worker=self.request.hostname or "celery")


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
    lease lapsed (stages_reconcile), queued ones whose message a dead worker took (claims_reconcile),
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
