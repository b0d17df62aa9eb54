"""The seam between the queue, the database and the stages.

Each task takes a run id, marks its stage running, calls one pure stage function with plain paths
and a progress callback, and hands the result to a service. The same `stage_execute` runs inline
for `run_pipeline --inline`.
"""
from __future__ import annotations

import collections
import logging
import shutil
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from celery import chain, shared_task
from django.conf import settings

from runs.curation import dataset_excluded_ids
from runs.extraction_services import extraction_training_gate, extraction_verify
from runs.models import PipelineRun
from runs.stage_services import (
    StageCancelled,
    checkpoints_register,
    manifest_record,
    metrics_record,
    stage_fail,
    stage_progress,
    stage_start,
    stage_succeed,
)
from runs.stages import STAGES

logger = logging.getLogger(__name__)


class StageReporter(logging.Handler):
    """Collects the stage's log lines and writes progress at most every few seconds."""

    def __init__(self, *, stage_name: str, run_id: int, interval: float):
        super().__init__(level=logging.INFO)
        self.stage_name, self.run_id, self.interval = stage_name, run_id, interval
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
            stage_progress(stage_name=self.stage_name, run_id=self.run_id, done=done, total=total, log_tail=self.tail)

    def cancelled(self) -> bool:
        try:
            self.progress(self.done, self.total)
        except StageCancelled:
            return True
        return False


def _fresh_dir(path: Path) -> Path:
    """A retried stage starts over: what an earlier, failed attempt left in the run's folder goes."""
    if path.exists():
        shutil.rmtree(path)
    return path


def _prepare(run: PipelineRun, reporter: StageReporter) -> dict:
    from workers.stages.prepare import prepare

    result = prepare(
        tokenizer_dir=Path(run.target.path),
        dataset_path=Path(run.dataset.path),
        out_dir=_fresh_dir(Path(run.output_dir) / "prepared"),
        max_seq_len=run.config["max_seq_len"],
        max_samples=run.config.get("max_samples"),
        exclude_ids=dataset_excluded_ids(dataset=run.dataset),
        on_progress=reporter.progress,
    )
    return {
        "out_dir": str(result.out_dir),
        "token_freq_path": str(result.token_freq_path),
        "num_conversations": result.num_conversations,
        "num_rows": result.num_rows,
        "num_skipped": result.num_skipped,
        "total_tokens": result.total_tokens,
        "loss_tokens": result.loss_tokens,
        "length_histogram": result.length_histogram,
    }


def _extract(run: PipelineRun, reporter: StageReporter) -> dict:
    from workers.stages.extract import extract

    result = extract(
        target_dir=Path(run.target.path),
        prepared_dir=Path(run.preparation.out_dir),
        out_dir=_fresh_dir(Path(run.output_dir) / "extraction"),
        layer_ids=run.extraction.layer_ids,
        on_progress=reporter.progress,
    )
    manifest_record(run_id=run.pk, path=Path(result.manifest_path))
    # Nobody trains on hidden states that disagree with their manifest: verify before train runs.
    extraction = run.extraction
    extraction.out_dir = str(result.out_dir)
    verification = extraction_verify(extraction=extraction)
    logger.info("extraction verification %s: %d checks in %.2f s", "passed" if verification.passed else "FAILED",
                len(verification.checks), verification.seconds)
    return {
        "out_dir": str(result.out_dir),
        "num_samples": result.num_samples,
        "total_tokens": result.total_tokens,
        "hidden_size": result.hidden_size,
        "dtype": result.dtype,
        "device": getattr(result, "device", ""),
        "model_load_seconds": result.model_load_seconds,
        "forward_seconds": result.forward_seconds,
        "tokens_per_second": result.tokens_per_second,
        "bytes_on_disk": result.bytes_on_disk,
    }


def _vocab(run: PipelineRun, reporter: StageReporter) -> dict:
    from workers.stages.vocab import build_vocab

    mapping = run.vocab_mapping
    result = build_vocab(
        token_freq_path=Path(run.preparation.token_freq_path),
        out_dir=Path(run.output_dir) / "vocab",
        draft_vocab_size=mapping.draft_vocab_size,
        target_vocab_size=mapping.target_vocab_size,
        on_progress=reporter.progress,
    )
    return {
        "out_dir": str(result.out_dir),
        "d2t_path": str(result.d2t_path),
        "t2d_path": str(result.t2d_path),
        "distinct_tokens": result.distinct_tokens,
        "coverage": result.coverage,
    }


def _train(run: PipelineRun, reporter: StageReporter) -> dict:
    from workers.stages.train import train

    training = run.training_run
    # Nobody trains on hidden states that disagree with their manifest, unless a reviewer said why.
    blocked = extraction_training_gate(extraction=run.extraction)
    if blocked:
        raise ValueError(blocked)
    result = train(
        target_dir=Path(run.target.path),
        prepared_dir=Path(run.preparation.out_dir),
        hidden_states_dir=Path(run.extraction.out_dir) / "hidden_states",
        d2t_path=Path(run.vocab_mapping.d2t_path),
        t2d_path=Path(run.vocab_mapping.t2d_path),
        out_dir=Path(run.output_dir) / "checkpoints",
        layer_ids=run.extraction.layer_ids,
        epochs=training.epochs,
        lr=training.lr,
        ttt_steps=training.ttt_steps,
        draft_vocab_size=run.vocab_mapping.draft_vocab_size,
        val_fraction=run.config.get("val_fraction", 0.1),
        seed=run.config.get("seed", 0),
        on_progress=reporter.progress,
        on_metrics=lambda points: metrics_record(training_run_id=training.pk, points=points),
        should_stop=reporter.cancelled,
        on_checkpoint=lambda c: checkpoints_register(training_run_id=training.pk, checkpoints=[asdict(c)]),
    )
    checkpoints_register(training_run_id=training.pk, checkpoints=[asdict(c) for c in result.checkpoints])
    return {
        "out_dir": str(result.out_dir),
        "steps": result.steps,
        "train_tokens": result.train_tokens,
        "tokens_per_second": result.tokens_per_second,
        "best_epoch": result.best_epoch,
    }


STAGE_BODIES: dict[str, Callable[[PipelineRun, StageReporter], dict]] = {
    "prepare": _prepare,
    "extract": _extract,
    "vocab": _vocab,
    "train": _train,
}


def stage_execute(*, stage_name: str, run_id: int, worker: str) -> bool:
    """Run one stage of one run; True if it succeeded. Failures are recorded, not raised."""
    if stage_start(stage_name=stage_name, run_id=run_id, worker=worker) is None:
        logger.info("%s of run %s is not queued any more; skipping", stage_name, run_id)
        return False
    reporter = StageReporter(stage_name=stage_name, run_id=run_id, interval=settings.EAGLE3WEB_PROGRESS_INTERVAL)
    watched = [logging.getLogger("workers"), logging.getLogger("speculators")]
    for log in watched:
        log.addHandler(reporter)
        log.setLevel(logging.INFO)
    try:
        run = PipelineRun.objects.select_related("target", "dataset").get(pk=run_id)
        logger.info("%s of run %s started on %s", stage_name, run_id, worker)
        fields = STAGE_BODIES[stage_name](run, reporter)
        logger.info("%s of run %s finished", stage_name, run_id)
        stage_succeed(stage_name=stage_name, run_id=run_id, fields=fields, log_tail=reporter.tail)
        return True
    except StageCancelled as exc:
        logger.info("%s", exc)
        stage_fail(stage_name=stage_name, run_id=run_id, error=str(exc), log_tail=reporter.tail, cancelled=True)
        return False
    except Exception as exc:  # noqa: BLE001 - every failure must reach the run page
        logger.exception("%s of run %s failed", stage_name, run_id)
        error = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
        stage_fail(stage_name=stage_name, run_id=run_id, error=error, log_tail=reporter.tail)
        return False
    finally:
        for log in watched:
            log.removeHandler(reporter)


@shared_task(bind=True, name="eagle3web.stage", acks_late=True)
def stage_task(self, stage_name: str, run_id: int) -> bool:
    return stage_execute(stage_name=stage_name, run_id=run_id, worker=self.request.hostname or "celery")


def pipeline_enqueue(*, run_id: int) -> None:
    """One chain per run; each stage goes to its own queue (cpu or gpu)."""
    chain(*[stage_task.si(stage.name, run_id).set(queue=stage.queue) for stage in STAGES]).apply_async()


def pipeline_run_inline(*, run_id: int) -> None:
    for stage in STAGES:
        stage_execute(stage_name=stage.name, run_id=run_id, worker="inline")
