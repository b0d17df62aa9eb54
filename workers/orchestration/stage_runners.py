"""Each stage's (and job's) runner: it turns the stage's row into the plain paths and settings its stage
function takes, calls it with the reporter's progress and stop callbacks, and returns the stage's result;
STAGE_BODIES maps stage names to them for workers.orchestration.tasks.stage_execute. Apart from the Celery tasks so that
workers.orchestration.tasks stays the seam (start, heartbeat, record, fail) and each stage's call reads in one place;
the StageReporter lives here because the runners name it and nothing may import workers.orchestration.tasks back.
"""
from __future__ import annotations

import collections
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from django.conf import settings

from eagle3web.db import db_retry
from runs.data.curation import dataset_exclusions, dataset_samples_sync
from runs.data.paths import check_under_data_roots
from runs.data.extractions import extraction_verify
from runs.checkpoints.evaluation import evaluation_plan
from runs.tracking.services import metrics_record
from runs.models import Evaluation, StageRecord
from runs.data.regeneration import regeneration_record
from runs.pipeline.status.live_tau import tau_flat_check
from runs.pipeline.models import TrainingRun
from runs.pipeline.lifecycle.result_records import STAGE_RECORDERS, checkpoints_register, measured_alongside_record
from runs.pipeline.lifecycle.stage_services import (
    StageCancelled,
    stage_progress,
    training_resume,
    training_split_record,
)
from runs.pipeline.dispatch.routing import stage_backend
from runs.pipeline.online import selectors as online_run
from workers.orchestration.online_tasks import hidden_states_dir as _hidden_states_dir, online_source as _online_source
from workers.contract.failures import trace_for_developers


class _LogFormatter(logging.Formatter):
    """The stage's log, which its page shows: an exception's frames without Python's traceback banner
    (workers.contract.failures.trace_for_developers); the worker's own log keeps the banner."""

    def formatException(self, ei) -> str:
        return trace_for_developers(ei[1]).rstrip("\n") if ei and ei[1] is not None else super().formatException(ei)


class StageReporter(logging.Handler):
    """Collects the stage's log lines and writes progress at most every few seconds."""

    def __init__(self, *, stage_name: str, record_id: int, interval: float, started_at=None):
        super().__init__(level=logging.INFO)
        self.stage_name, self.record_id, self.interval = stage_name, record_id, interval
        self.started_at = started_at  # which attempt this is: a replaced attempt can no longer write
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.setFormatter(_LogFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
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


def _target_dir(run) -> Path:
    """The run's target folder, confined again as its stage starts (runs.data.paths): a file in it linked out of
    the data roots since the launch fails the stage, naming the file, before a loader opens what it leads to."""
    return check_under_data_roots(run.target.path, kind="target directory")


def _prepare(record, reporter: StageReporter):
    from workers.stages.prepare.stage import prepare

    run = record.run
    excluded = dataset_exclusions(dataset=run.dataset)
    return prepare(
        tokenizer_dir=_target_dir(run),
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
    from workers.contract.host.backends import backend_require

    backend, gpus = stage_backend(stage_name=stage_name, config=run.config or {})
    backend_require(name=backend, gpus=gpus)
    return backend, gpus


def _extract(record, reporter: StageReporter):
    from workers.stages.extract.resume import RESUME_NAME

    run = record.run
    if online_run.is_online(run.config):
        return online_run.online_extract(run=run)  # training captures the hidden states; nothing to extract
    backend, gpus = _backend(run, "extract")
    common = dict(target_dir=_target_dir(run), prepared_dir=Path(run.preparation.out_dir),
                  out_dir=_resumable_dir(Path(run.output_dir) / "extraction", marker=RESUME_NAME),
                  layer_ids=record.layer_ids, on_progress=reporter.progress)
    if backend == "vllm":
        from workers.contract.host.backends import vllm_executable
        from workers.stages.extract.with_vllm import extract_with_vllm

        return extract_with_vllm(**common, tensor_parallel_size=gpus, vllm_executable=vllm_executable(),
                                 should_stop=reporter.cancelled)
    from workers.stages.extract.with_transformers import extract

    return extract(**common, num_gpus=gpus, batch_tokens=settings.EAGLE3WEB_EXTRACT_BATCH_TOKENS or None)


def _vocab(record, reporter: StageReporter):
    from workers.contract.extraction.speculators_layout import run_data_link
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


def train_arguments(record) -> dict:
    """The training's plain arguments (paths and settings), the same on every node of a training across nodes."""
    run = record.run
    online = _online_source(run)
    return dict(
        val_fraction=run.config.get("val_fraction", 0.1),
        max_tokens_per_step=run.config.get("max_tokens_per_step"),
        **({"online": online} if online is not None else {}),  # the loop reads the cache, asks the servers the rest
        target_dir=_target_dir(run),
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
    )


def train_plan(training_id: int) -> tuple[dict, str, int]:
    """A rank's view of a training across nodes (workers.orchestration.node_runner): its arguments, backend and GPU
    count."""
    record = TrainingRun.objects.select_related("run__target", "run__dataset").get(pk=training_id)
    backend, gpus = _backend(record.run, "train")
    return train_arguments(record), backend, gpus


def _train(record, reporter: StageReporter):
    run = record.run
    backend, gpus = _backend(run, "train")
    arguments = dict(
        train_arguments(record),
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
    if run.config.get("stop_when_tau_flat"):  # asked after every step; the database read at most every 2 s
        arguments["stop_early"] = tau_flat_check(training_run_id=record.pk, patience=int(run.config["stop_when_tau_flat"]))
    if (nodes := int(run.config.get("train_nodes") or 1)) > 1:
        from workers.orchestration.node_runner import training_lead

        return training_lead(record=record, worker=record.worker, started_at=reporter.started_at, nodes=nodes,
                             backend=backend, gpus=gpus, arguments=arguments)
    if backend == "speculators":
        from workers.stages.train.with_speculators.trainer import train_with_speculators as trainer

        arguments.update(num_gpus=gpus, extra_args=settings.EAGLE3WEB_SPECULATORS_ARGS)
    else:  # in a process of its own: torch's compile state and CUDA memory end with the training
        from workers.stages.train.processes.in_child import train_in_child as trainer
    return trainer(**arguments)


def _evaluate(record: Evaluation, reporter: StageReporter):
    from workers.contract.acceptance import evaluation_phases
    from workers.stages.evaluate.measure import evaluate
    from workers.stages.evaluate.prompts import prompts_load

    # A run's stage loads the target on its extraction's GPU count (runs.pipeline.dispatch.routing sent it to the queue
    # of Transformers on that many); a standalone evaluation, sent to "gpu", and a run from before
    # GPU counts (no key: the default, 1) on one device.
    num_gpus = 1
    if record.run_id is not None:
        _, num_gpus = stage_backend(stage_name="evaluate", config=record.run.config or {})
        if num_gpus != 1:
            _backend(record.run, "evaluate")  # refused here, naming why, on a worker that cannot spread it
    plan = evaluation_plan(evaluation=record)
    settings_ = dict(target_dir=plan.target_dir, max_new_tokens=record.max_new_tokens,
                     num_speculative_tokens=record.num_speculative_tokens, num_gpus=num_gpus,
                     should_stop=reporter.cancelled, k_beyond=settings.EAGLE3WEB_K_BEYOND_TRAINED)
    held_out = prompts_load(plan.prompts)
    # The run's evaluation suites first, on every checkpoint, then its held-out prompts: the stage's own row,
    # recorded last, decides the best (runs.pipeline.best) once every measurement it compares is in.
    suites = {name: (str(source.path), prompts_load(source)) for name, source in plan.suites.items()}
    # One progress over every pass the stage makes (prompts x checkpoints x suites x passes: the measurement, then
    # the k table's probes, as long again), said from the start: the page showed "–" until the last checkpoint
    # began, then counted that one's prompts alone, and said done while the k table still ran.
    passes = evaluation_phases(settings.EAGLE3WEB_K_BEYOND_TRAINED)
    total = passes * ((len(plan.also) + 1) * len(held_out)
                      + len(plan.suite_checkpoints) * sum(len(p) for _, p in suites.values()))
    done = 0
    reporter.progress(0, total)

    def measured(checkpoint_dir: Path, prompts: list[list[int]], source: str):
        nonlocal done
        start = done
        result = evaluate(checkpoint_dir=checkpoint_dir, prompts=prompts, prompt_source=source,
                          on_progress=lambda n, _of: reporter.progress(start + n, total), **settings_)
        done = start + len(prompts) * passes
        return result

    # Recorded with this measurement's settings: a serve check of one of them derives its prompts from them.
    for name, (path, prompts) in suites.items():
        for checkpoint_id, checkpoint_dir in plan.suite_checkpoints:
            db_retry("evaluation", measured_alongside_record, measured=record, checkpoint_id=checkpoint_id,
                     result=measured(checkpoint_dir, prompts, f"evaluation suite {name} ({path})"),
                     prompts_path=path, suite=name)
    for checkpoint_id, checkpoint_dir in plan.also:
        db_retry("evaluation", measured_alongside_record, measured=record, checkpoint_id=checkpoint_id,
                 result=measured(checkpoint_dir, held_out, plan.prompt_source))
    return measured(plan.checkpoint_dir, held_out, plan.prompt_source)


def _catalogue(record, reporter: StageReporter):
    return dataset_samples_sync(dataset=record.dataset, on_progress=reporter.progress)


def _verify(record, reporter: StageReporter):
    return extraction_verify(extraction=record.extraction, full=record.full, on_progress=reporter.progress,
                             requested_by=record.requested_by)


def _serve_check(record, reporter: StageReporter):
    from runs.checkpoints.serve_check_services import serve_check_plan
    from workers.contract.host.backends import vllm_executable
    from workers.stages.evaluate.prompts import prompts_load
    from workers.stages.evaluate.serve_check import serve_check

    plan = serve_check_plan(check=record)
    return serve_check(target_dir=plan.target_dir, checkpoint_dir=plan.checkpoint_dir,
                       prompts=plan.prompts_checked(prompts_load(plan.prompts)),
                       max_new_tokens=plan.max_new_tokens, num_speculative_tokens=plan.num_speculative_tokens,
                       tensor_parallel_size=record.tensor_parallel_size, vllm_executable=vllm_executable(),
                       concurrency=plan.concurrency,
                       out_dir=Path(settings.EAGLE3WEB_RUNS_DIR) / "serve_checks" / str(record.pk),
                       on_progress=reporter.progress, should_stop=reporter.cancelled)


def _regenerate(record, reporter: StageReporter):
    from runs.data.regeneration import regeneration_plan
    from workers.contract.host.backends import vllm_executable
    from workers.stages.regenerate.base import RegenerateSettings
    from workers.stages.regenerate.stage import regenerate

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


def _demo_build(record, reporter: StageReporter):
    from workers.stages.demo.assets import build_demo_assets

    return build_demo_assets(Path(record.out_dir), num_conversations=record.num_conversations,
                             train_steps=record.train_steps, seed=record.seed, on_progress=reporter.progress)


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
    "demo_build": _demo_build,
}

# What each stage's (and job's) worker records once it succeeded. The regeneration's recorder lives with
# its service (runs.data.regeneration), which itself records through runs.pipeline.lifecycle.stage_services.
RECORDERS = {**STAGE_RECORDERS, "regenerate": regeneration_record}


def failure_context(record, kind) -> dict:
    """What a failure's sentence may name: the run's target and dataset paths and its packing budget.
    Empty for a job, or when the row could not even be loaded (record None)."""
    run = getattr(record, "run", None) if record is not None and not kind.is_job else None
    if run is None:
        return {}
    return {"target": run.target.path, "dataset": run.dataset.path,
            "max_tokens_per_step": (run.config or {}).get("max_tokens_per_step")}
