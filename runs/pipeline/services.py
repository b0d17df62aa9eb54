"""Writes that users start: registering targets and datasets, launching and cancelling runs."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from runs.checkpoints.models import Evaluation
from runs.data.models import Dataset, TargetModel
from runs.pipeline.models import ExtractStage, PipelineRun, Preparation, TrainingRun, VocabMapping
from runs.pipeline.lifecycle import signals
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES, StageStatus
from runs.fleet.fit import host_refusals, serve_check_refusal
from runs.fleet.selectors import launch_refusals, stage_refusals, workers_live
from runs.data.demo import demo_build_refusal
from runs.data.paths import check_under_data_roots
from runs.pipeline.lifecycle.failure_selectors import run_failure
from runs.data.suites import eval_suites_register
from runs.pipeline.launch.dataset_launch_check import HEAD_BYTES, HEAD_CONVERSATIONS, dataset_head, dataset_launch_check
from runs.pipeline.online.selectors import online_refusal
from runs.pipeline.dispatch.queue import pipeline_enqueue
from runs.pipeline.shards.models import StageShard
from runs.pipeline.launch.preflight import launch_preflight
from runs.projects.services import launch_project
from runs.roles import require, require_on_run
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.launch.setting_checks import check_run_name
from runs.pipeline.lifecycle.stages import STAGES
from workers.contract.errors import InputError
from workers.contract.target import (default_layer_ids, read_target_json, target_config_from, target_weight_bytes,
                                     validate_layer_ids)


def target_register(*, path: str | Path) -> TargetModel:
    """Record (or refresh) a target from its config.json; the path must lie under the data roots."""
    resolved = check_under_data_roots(path, kind="target directory")
    if not resolved.is_dir():
        raise RunConfigError(f"target directory {resolved} is not a directory")
    raw = read_target_json(resolved)  # read once: what is checked is what is stored
    cfg = target_config_from(raw, path=resolved / "config.json")
    target, _ = TargetModel.objects.update_or_create(
        path=str(resolved),
        defaults={
            "name": resolved.name,
            "architecture": cfg.architecture,
            "model_type": cfg.model_type,
            "num_layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "nested_text_config": cfg.nested_text_config,
            "config": raw,
        },
    )
    return target


# What registering a dataset reads before answering: enough to refuse a file that is not a chat file
# (the first conversations), bounded so that a multi-GB file costs the request little
# (runs.pipeline.launch.dataset_launch_check). The whole file is catalogued by a worker
# (runs.pipeline.jobs.services.dataset_catalogue_request).
HEAD_CHECK_CONVERSATIONS = HEAD_CONVERSATIONS
HEAD_CHECK_BYTES = HEAD_BYTES


def dataset_check_head(path: Path) -> int:
    """Read the file's first conversations (up to the bounds above); a bad line raises naming file and
    line. Returns how many were read."""
    return len(dataset_head(path).conversations)


def dataset_register(*, path: str | Path) -> Dataset:
    """Record a chat file after checking its first conversations; a new or changed file is then
    catalogued in full by a worker, after the caller's transaction commits."""
    from runs.pipeline.jobs.services import dataset_catalogue_request

    resolved = check_under_data_roots(path, kind="dataset file")
    if not resolved.is_file():
        raise RunConfigError(f"dataset {resolved} is not a file (give a .jsonl chat file)")
    dataset_check_head(resolved)
    size = resolved.stat().st_size
    dataset, created = Dataset.objects.get_or_create(path=str(resolved), defaults={"name": resolved.name})
    if created or dataset.size_bytes != size:
        dataset.size_bytes = size
        dataset.save(update_fields=["size_bytes"])
        dataset_catalogue_request(dataset=dataset)
    return dataset


@contextmanager
def input_blames(field: str) -> Iterator[None]:
    """An input error raised inside names `field` unless it names one already: the launch form shows
    it on that field (and in its summary), a sweep names the swept value to blame."""
    try:
        yield
    except InputError as exc:
        if not getattr(exc, "field", None):
            exc.field = field
        raise


def _with_final_layer(layer_ids: list[int], num_layers: int) -> list[int]:
    # The draft learns from the final hidden state, so it is always captured after the aux layers.
    return [*layer_ids, num_layers] if layer_ids and layer_ids[-1] != num_layers else list(layer_ids)


def _preflight_outside_transaction(*, target_path: str | Path, config: RunConfig) -> dict | None:
    """The launch's preflight (vLLM's config check takes seconds the first time a target is seen), run
    before the launch's transaction opens, so that no lock is held meanwhile (SQLite's BEGIN IMMEDIATE
    would hold every writer back). None when the target is refused by an earlier check, or when a caller's
    own transaction is open (a sweep, an idempotent API launch): the launch then checks inside."""
    if transaction.get_connection().in_atomic_block:
        return None
    try:
        resolved = check_under_data_roots(target_path, kind="target directory")
        cfg = target_config_from(read_target_json(resolved), path=resolved / "config.json")
        layer_ids = validate_layer_ids(_with_final_layer(list(config.layer_ids or default_layer_ids(cfg.num_layers)),
                                                         cfg.num_layers), cfg.num_layers)
    except (InputError, OSError):
        return None  # refused inside, naming its field, as before
    if config.draft_vocab_size > cfg.vocab_size:
        return None
    return launch_preflight(target_dir=resolved, vocab_size=cfg.vocab_size, layer_ids=layer_ids, config=config)


MAX_NOTES_CHARS = 10_000


def run_launch(
    *,
    user: AbstractBaseUser,
    target_path: str | Path,
    dataset_path: str | Path,
    config: RunConfig,
    name: str = "",
    enqueue: bool = True,
    check: str = "fleet",
    project: str | None = None,
    notes: str = "",
) -> PipelineRun:
    """Create a run and its five stage rows; after commit, hand the run's id to the workers.

    `check` says who must be able to run the chosen backends: "fleet", the live workers (the stages
    go to their queues); "this_host", this host by its own probe, for stages run in this process
    (run_pipeline --inline), whatever the live workers can or cannot run. `project`: its name (the user
    must be an editor there); None or empty: Default (runs.projects.access.default_project_for)."""
    require(user, "launch")
    chosen = launch_project(user=user, name=project)
    checked = _preflight_outside_transaction(target_path=target_path, config=config)
    return _run_create(user=user, target_path=target_path, dataset_path=dataset_path, config=config, name=name,
                       enqueue=enqueue, check=check, checked=checked, project=chosen, notes=notes)


@transaction.atomic
def _run_create(*, user: AbstractBaseUser, target_path: str | Path, dataset_path: str | Path, config: RunConfig,
                name: str, enqueue: bool, check: str, checked: dict | None, project, notes: str) -> PipelineRun:
    if check not in ("fleet", "this_host"):
        raise ValueError(f"check must be 'fleet' or 'this_host', got {check!r}")
    name = check_run_name(name)
    if not isinstance(notes, str) or len(notes) > MAX_NOTES_CHARS:
        raise RunConfigError(f"notes must be text of at most {MAX_NOTES_CHARS:,} characters", field="notes")
    if waiting := demo_build_refusal(target_path=target_path, dataset_path=dataset_path):
        field, why = waiting  # `make demo`'s target is being built on a worker: refused, saying how far it is
        raise RunConfigError(why, field=field)
    with input_blames("target_path"):
        target = target_register(path=target_path)
    # Rolled back with the target's row when refused: nothing stored.
    weight_bytes = target_weight_bytes(Path(target.path))
    refusals = (launch_refusals(config=config, weight_bytes=weight_bytes) if check == "fleet"
                else host_refusals(config=config, weight_bytes=weight_bytes))
    if not refusals and (why := serve_check_refusal(config=config, live=list(workers_live()) if check == "fleet"
                                                    else None)):
        refusals = [why]
    if not refusals and (why := online_refusal(config=config, check=check,
                                               live=list(workers_live()) if check == "fleet" else None)):
        refusals = [why]
    if refusals:  # refused now rather than left in a queue that no live worker takes, or failed at extract
        field, why = refusals[0]
        raise RunConfigError(why, field=field)
    with input_blames("dataset_path"):
        dataset = dataset_register(path=dataset_path)
        # An empty file, or one no conversation of which trains, refused now rather than in prepare.
        dataset_launch_check(path=Path(dataset.path), max_seq_len=config.max_seq_len, target_dir=Path(target.path))
    layer_ids = _with_final_layer(list(config.layer_ids or target.default_layer_ids), target.num_layers)
    with input_blames("layer_ids"):
        layer_ids = validate_layer_ids(layer_ids, target.num_layers)
    if config.draft_vocab_size > target.vocab_size:
        raise RunConfigError(
            f"draft_vocab_size {config.draft_vocab_size} is larger than the target's vocabulary ({target.vocab_size})",
            field="draft_vocab_size")
    # The tokenizer against the vocabulary, and vLLM's own config classes where vLLM is here (seconds):
    # refused now, with nothing stored, rather than after prepare and extraction spent a GPU.
    if checked is None:
        checked = launch_preflight(target_dir=Path(target.path), vocab_size=target.vocab_size, layer_ids=layer_ids,
                                   config=config)
    # Each suite's chat file confined, checked and registered (or the registered one's): refused naming it.
    suites = eval_suites_register(suites=config.eval_suites, user=user) if config.eval_suites else {}
    config = replace(config, layer_ids=layer_ids, eval_suites=suites)
    run = PipelineRun.objects.create(
        owner=user, name=name, target=target, dataset=dataset, config={**config.as_dict(), **checked},
        project=project, notes=notes,
    )
    run.output_dir = str(settings.EAGLE3WEB_RUNS_DIR / f"run-{run.pk}")
    run.save(update_fields=["output_dir"])
    Preparation.objects.create(run=run, dataset=dataset, max_seq_len=config.max_seq_len)
    ExtractStage.objects.create(run=run, target=target, layer_ids=layer_ids)
    VocabMapping.objects.create(
        run=run, draft_vocab_size=config.draft_vocab_size, target_vocab_size=target.vocab_size
    )
    TrainingRun.objects.create(run=run, epochs=config.epochs, lr=config.lr, ttt_steps=config.ttt_steps)
    Evaluation.objects.create(run=run, requested_by=user, max_prompts=config.eval_prompts,
                              max_new_tokens=config.eval_max_new_tokens)
    if enqueue:
        pipeline_enqueue(run_id=run.pk)
    return run


@transaction.atomic
def run_cancel(*, run: PipelineRun, user: AbstractBaseUser) -> int:
    """Mark every unfinished stage cancelled; a running stage notices at its next progress report."""
    require_on_run(user, run, "cancel")
    now = timezone.now()
    cancelled = 0
    for stage in STAGES:
        cancelled += stage.model.objects.filter(run=run).exclude(status__in=FINISHED_STATUSES).update(
            status=StageStatus.CANCELLED, finished_at=now, error=f"cancelled by {user.get_username()}"
        )
    StageShard.objects.filter(run=run, status__in=[StageStatus.QUEUED, StageStatus.RUNNING]).update(
        status=StageStatus.CANCELLED, finished_at=now, lease_expires_at=None)  # their workers stop at their next report
    signals.run_over.send(sender=PipelineRun, run_id=run.pk)  # its sweep's next run, if it had one waiting
    return cancelled


@transaction.atomic
def run_retry(*, run: PipelineRun, user: AbstractBaseUser) -> int:
    """Queue a run's failed and cancelled stages again; stages that succeeded are kept and skipped.
    Refused, saying why, when no live worker takes a stage it would queue (its backend's worker went
    away, say): queued again, it would wait there for ever."""
    require_on_run(user, run, "retry")
    if run.external:
        raise RunConfigError(f"{run} was trained elsewhere: nothing of it runs here to retry; its trainer "
                             "creates a new external run")
    failure = run_failure([(s.name, s.label, row) for s in STAGES if (row := s.model.objects.filter(run=run).first())])
    if failure and not failure.retryable:
        # Its settings or files caused it: queued again, it would fail the same way (workers.contract.failures).
        raise RunConfigError(f"{run} cannot be retried: {failure.sentence} {failure.why[:1].upper()}{failure.why[1:]}"
                             f"{f' (change {failure.field})' if failure.field else ''}.", field=failure.field or None)
    again = [stage.name for stage in STAGES if stage.model.objects.filter(
        run=run, status__in=[StageStatus.FAILED, StageStatus.CANCELLED]).exists()]
    refusals = stage_refusals(config=run.config or {}, stage_names=again,
                              weight_bytes=target_weight_bytes(Path(run.target.path)))
    if refusals:
        raise RunConfigError(f"{run} cannot be retried now: {refusals[0][1]}. Start a worker that takes it, or "
                             "launch a copy with another backend.", field=refusals[0][0])
    reset = 0
    now = timezone.now()
    for stage in STAGES:
        # queued_at is set on create only (auto_now_add): a retried stage joins the back of its queue
        # now, and the workers page orders each queue by it.
        reset += stage.model.objects.filter(run=run, status__in=[StageStatus.FAILED, StageStatus.CANCELLED]).update(
            status=StageStatus.QUEUED, error="", error_trace="", failure_kind="", failure_field="", started_at=None,
            finished_at=None, progress_done=0, progress_total=0, queued_at=now,
        )
    if reset:
        pipeline_enqueue(run_id=run.pk)
    return reset
