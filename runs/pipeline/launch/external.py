"""Runs trained elsewhere: a trainer on another machine reports its run through the API.

Such a run (`PipelineRun.external`) is created with the trainer's settings and has one stage row, its
training, running from the moment it is created until its client ends it (or a user cancels it).
Nothing of it is ever queued: no worker takes it, the reconciler passes it by
(runs.pipeline.lifecycle.stage_services.stages_reconcile), and retrying it is refused. Its curves, checkpoints
and end come from its client, through these services, which every API view calls.
"""
from __future__ import annotations

import json
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from runs.checkpoints.imports import CheckpointError, checkpoint_check, checkpoint_records
from runs.data.paths import check_under_data_roots
from runs.checkpoints.models import Checkpoint
from runs.pipeline.models import PipelineRun, TrainingRun
from runs.pipeline.lifecycle import signals
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.status import changes
from runs.pipeline.launch.setting_bounds import RunConfigError
from runs.pipeline.launch.setting_checks import check_run_name
from runs.pipeline.status.upstream_commands import recorded_speculative_tokens
from runs.roles import require, require_on_run
from runs.tracking.reported_points import PointCounts, points_check, points_report

MAX_CONFIG_BYTES = 64 * 1024
END_STATUSES = (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED)
MAX_MESSAGE_CHARS = 20_000


class RunStateError(Exception):
    """What was asked does not fit the run as it stands (not external, already ended): a 409 in the API."""


def _setting(config: dict, name: str, kind: type, default):
    """A trainer's setting the training row has a column for, when the config gives one of that kind."""
    value = config.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < 0:
        return default
    return kind(value)


@transaction.atomic
def external_run_create(*, user: AbstractBaseUser, name: str, config: object, target_path: str = "",
                        dataset_path: str = "") -> PipelineRun:
    """A run trained elsewhere, with its trainer's settings; its target and dataset only when given (and
    then registered as a launch registers them: under the data roots, read and checked)."""
    from runs.pipeline.services import dataset_register, input_blames, target_register

    require(user, "report")
    name = check_run_name(name)
    if not isinstance(config, dict):
        raise RunConfigError(f"config must be a JSON object of the trainer's settings, got {type(config).__name__}",
                             field="config")
    size = len(json.dumps(config))
    if size > MAX_CONFIG_BYTES:
        raise RunConfigError(f"config is {size:,} bytes of JSON; at most {MAX_CONFIG_BYTES:,}", field="config")
    target = dataset = None
    if target_path:
        with input_blames("target_path"):
            target = target_register(path=target_path)
    if dataset_path:
        with input_blames("dataset_path"):
            dataset = dataset_register(path=dataset_path)
    run = PipelineRun.objects.create(owner=user, name=name, target=target, dataset=dataset, config=config,
                                     external=True)
    # What the training row has columns for, as the trainer named them (run_pipeline's names); 0 when not given.
    TrainingRun.objects.create(run=run, status=StageStatus.RUNNING, started_at=timezone.now(),
                               epochs=_setting(config, "epochs", int, 0), lr=_setting(config, "lr", float, 0.0),
                               ttt_steps=_setting(config, "ttt_steps", int, 0), worker="elsewhere")
    return run


def _external_training(run: PipelineRun, *, user: AbstractBaseUser, running: bool, what: str) -> TrainingRun:
    require_on_run(user, run, "report")
    if not run.external:
        raise RunStateError(f"run {run.pk} is a pipeline run: its workers write its {what}; only a run created "
                            "with \"external\": true takes them from a client")
    training = TrainingRun.objects.select_for_update().get(run=run)
    if running and training.status != StageStatus.RUNNING:
        raise RunStateError(f"run {run.pk} has ended ({training.status} at {training.finished_at:%Y-%m-%d %H:%M:%S}); "
                            f"it takes no more {what}: create a new external run for a new training")
    return training


@transaction.atomic
def external_points_report(*, run: PipelineRun, user: AbstractBaseUser, points: object) -> PointCounts:
    """A batch of curve points from the run's client: all stored or, on any bad point, none."""
    training = _external_training(run, user=user, running=True, what="points")
    counts = points_report(training_run_id=training.pk, points=points_check(points))
    if counts.accepted:  # the glance header's step: the latest train step reported
        last = training.metric_series.filter(split="train").order_by("-last_step").values_list(
            "last_step", flat=True).first()
        if last is not None and last != training.progress_done:
            TrainingRun.objects.filter(pk=training.pk).update(progress_done=last)
    return counts


@transaction.atomic
def external_run_end(*, run: PipelineRun, user: AbstractBaseUser, status: str, message: str = "") -> TrainingRun:
    """The run's client says how its training ended: succeeded, failed or cancelled, and why."""
    if status not in END_STATUSES:
        raise RunConfigError(f"status must be one of {', '.join(END_STATUSES)}, got {str(status)[:40]!r}",
                             field="status")
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        raise RunConfigError(f"message must be text of at most {MAX_MESSAGE_CHARS:,} characters", field="message")
    training = _external_training(run, user=user, running=True, what="end")
    TrainingRun.objects.filter(pk=training.pk).update(
        status=status, finished_at=timezone.now(), error="" if status == StageStatus.SUCCEEDED else message,
        log_tail=message if status == StageStatus.SUCCEEDED else training.log_tail)
    training.refresh_from_db()
    if status == StageStatus.FAILED:  # a run trained elsewhere that failed is heard of like one of ours
        signals.run_failed.send(sender=PipelineRun, run_id=run.pk, stage_name="train",
                                error=message or "its client ended it failed")
    return training


@transaction.atomic
def external_checkpoint_register(*, run: PipelineRun, user: AbstractBaseUser, path: str, epoch: object,
                                 verifier: str = "") -> tuple[Checkpoint, bool]:
    """A checkpoint the run's trainer wrote, checked as import_checkpoint checks one (under the data roots,
    speculators' eagle3 layout, loads with Eagle3DraftModel against its verifier: `verifier`, else the run's
    target, else the one it records). The same path at the same epoch again is the same checkpoint
    (returned, `False`); taken also after the run ended, for a trainer that saves its last one then."""
    training = _external_training(run, user=user, running=False, what="checkpoints")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 2**31:
        raise RunConfigError(f"epoch must be a whole number from 0, got {str(epoch)[:40]!r}", field="epoch")
    try:
        resolved = check_under_data_roots(path, kind="checkpoint directory")
    except Exception as exc:
        exc.field = "path"
        raise
    local_verifier = None
    if verifier:
        try:
            local_verifier = check_under_data_roots(verifier, kind="verifier directory")
        except Exception as exc:
            exc.field = "verifier"
            raise
    elif run.target_id is not None:
        local_verifier = Path(run.target.path)
    same_epoch = training.checkpoints.filter(epoch=epoch).first()
    if same_epoch is not None:
        if same_epoch.path == str(resolved):
            return same_epoch, False
        raise RunConfigError(f"epoch {epoch} of run {run.pk} is registered already, as {same_epoch.path} "
                             f"(checkpoint {same_epoch.pk}); give each epoch one directory", field="epoch")
    elsewhere = Checkpoint.objects.filter(path=str(resolved)).first()
    if elsewhere is not None:
        raise RunConfigError(f"{resolved} is registered already as checkpoint {elsewhere.pk} ({elsewhere}); a "
                             "directory is one checkpoint", field="path")
    try:
        config, verifier_path = checkpoint_check(resolved=resolved, local_verifier=local_verifier)
        _, val = checkpoint_records(resolved)
    except CheckpointError as exc:
        raise RunConfigError(str(exc), field="path") from None
    checkpoint = Checkpoint.objects.create(
        training_run=training, epoch=epoch, path=str(resolved), val_loss=val.get("loss_epoch"), val_metrics=val,
        verifier_path=verifier_path, aux_layer_ids=list(config.get("eagle_aux_hidden_state_layer_ids") or []),
        draft_vocab_size=config.get("draft_vocab_size"), speculative_tokens=recorded_speculative_tokens(resolved))
    changes.training_changed(training_run_id=training.pk)  # its pages and the runs list show checkpoints
    return checkpoint, True
