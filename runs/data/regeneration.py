"""Regenerating a dataset's replies with a target (runs.pipeline.jobs.models.DatasetRegeneration): asking for
one, cancelling or retrying it, what the worker runs, and recording the dataset it made.

What makes the output is hashed into `settings_key` (the source file as it is now, the target, the
backend, the sampling settings, the seed, the sample cap, curation's exclusions): asking again with the
same key returns the job that made (or is making) that file, and a failed or cancelled one is queued
again, resuming the conversations its file already holds (workers.stages.regenerate)."""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from runs.data.curation import dataset_exclusions
from runs.data.paths import check_under_data_roots
from runs.data.models import Dataset, TargetModel
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES, StageStatus
from runs.pipeline.jobs.models import DatasetRegeneration
from runs.pipeline.dispatch.queue import job_enqueue, pending_enqueue
from runs.pipeline.launch.setting_bounds import MAX_SHARDS
from runs.projects import access
from runs.roles import require
from workers.contract.errors import InputError

BACKENDS = ("vllm", "transformers")
BACKEND_CHOICES = ("auto", *BACKENDS)
MAX_NEW_TOKENS_LIMIT = 32768
MAX_TEMPERATURE = 5.0
MAX_SEED = 2**31 - 1
OUTPUT_FOLDER = "regenerated"  # beside the source, under the data root that holds it


class RegenerationRequestError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RegenerationSettings:
    """What the user chose; `backend` "auto" takes vLLM where it runs, else transformers."""

    backend: str = "auto"
    max_new_tokens: int = 512
    temperature: float = 0.0
    seed: int = 0
    max_samples: int | None = None
    tensor_parallel_size: int = 1
    shards: int | None = None  # how many workers share it (issue 36): not part of what it makes

    def check(self) -> None:
        if self.backend not in BACKEND_CHOICES:
            raise RegenerationRequestError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got "
                                           f"{str(self.backend)[:40]!r}", field="backend")
        ints = {"max_new_tokens": (1, MAX_NEW_TOKENS_LIMIT), "seed": (0, MAX_SEED), "tensor_parallel_size": (1, 64)}
        for name, (low, high) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise RegenerationRequestError(f"{name} must be a whole number from {low} to {high}, got "
                                               f"{str(value)[:40]!r}", field=name)
        if self.max_samples is not None and (isinstance(self.max_samples, bool) or not isinstance(self.max_samples, int)
                                             or self.max_samples < 1):
            raise RegenerationRequestError(f"max_samples must be a whole number of at least 1 (or empty for all), got "
                                           f"{str(self.max_samples)[:40]!r}", field="max_samples")
        if self.shards is not None and (isinstance(self.shards, bool) or not isinstance(self.shards, int)
                                        or not 1 <= self.shards <= MAX_SHARDS):
            raise RegenerationRequestError(f"shards must be a whole number from 1 to {MAX_SHARDS} (or empty: one per "
                                           f"live worker), got {str(self.shards)[:40]!r}", field="shards")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 <= t <= MAX_TEMPERATURE:
            raise RegenerationRequestError(f"temperature must be a number from 0 (greedy) to {MAX_TEMPERATURE:g}, got "
                                           f"{str(t)[:40]!r}", field="temperature")


def regeneration_backend(*, requested: str, gpus: int, where: str) -> str:
    """The backend the job uses: the one asked for, or for "auto" vLLM where it runs, else transformers.
    `where`: "fleet" (a live worker must take its queue) or "this_host" (the command's --inline).
    Refuses, naming each reason, when nothing can run it."""
    from runs.fleet.fit import worker_unfit
    from runs.fleet.selectors import workers_live
    from workers.contract.host.backends import BackendUnavailable, backend_require, stage_queue

    reasons = []
    for name in BACKENDS if requested == "auto" else (requested,):
        if where == "this_host":
            try:
                backend_require(name=name, gpus=gpus)
                return name
            except BackendUnavailable as exc:
                reasons.append(str(exc))
        else:
            live = list(workers_live())
            if any(worker_unfit(w, backend=name, gpus=gpus) is None for w in live):
                return name
            reasons.append(f"no live worker takes {stage_queue(backend=name, gpus=gpus)} ({name} on {gpus} device(s))")
    raise RegenerationRequestError("cannot regenerate here: " + "; ".join(reasons) +
                                   ". Start a worker that takes it (`make vllm` installs vLLM), or pick another backend",
                                   field="backend")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "x"


def _source_state(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@transaction.atomic
def dataset_regenerate_request(*, dataset: Dataset, target: TargetModel, settings: RegenerationSettings,
                               user: AbstractBaseUser | None, where: str = "fleet", enqueue: bool = True
                               ) -> tuple[DatasetRegeneration, bool]:
    """(the job, whether it was queued now). The job that made this output with these settings is
    returned as it is when it succeeded and its file is there, or when it is queued or running; one
    that failed or was cancelled (or whose file went) is queued again and resumes its file."""
    from workers.contract.chats.template import target_chat_check

    if user is not None:
        require(user, "launch")
    settings.check()
    source = check_under_data_roots(dataset.path, kind="dataset file")
    if not source.is_file():
        raise RegenerationRequestError(f"dataset {dataset.name}: {source} is not a file any more", field="dataset")
    try:
        target_chat_check(Path(target.path))  # no tokenizer or chat template: say so now, not on a worker
    except InputError as exc:
        raise RegenerationRequestError(str(exc), field="target") from None
    backend = regeneration_backend(requested=settings.backend, gpus=settings.tensor_parallel_size, where=where)
    Dataset.objects.select_for_update().filter(pk=dataset.pk).first()  # one request at a time per dataset
    exclusions = dataset_exclusions(dataset=dataset)
    excluded = {"ids": sorted(exclusions.ids), "hashes": sorted(exclusions.hashes), "own_ids": sorted(exclusions.own_ids)}
    size, mtime_ns = _source_state(source)
    # The shards change who writes the file, not what it holds: the same job, whichever split is asked.
    chosen = {**{k: v for k, v in asdict(settings).items() if k != "shards"}, "backend": backend}
    key = hashlib.sha256(json.dumps({"source": [str(source), size, mtime_ns], "target": target.path, **chosen,
                                     "exclusions": excluded}, sort_keys=True).encode()).hexdigest()
    job = DatasetRegeneration.objects.filter(settings_key=key).order_by("-id").first()
    if job is not None:
        if job.shards != settings.shards:  # read when it (re)starts: its first attempt decides the split
            DatasetRegeneration.objects.filter(pk=job.pk).update(shards=settings.shards)
            job.shards = settings.shards
        return job, _again(job, enqueue=enqueue)
    job = DatasetRegeneration.objects.create(
        source=dataset, source_path=str(source), source_size_bytes=size, target=target, backend=backend,
        tensor_parallel_size=settings.tensor_parallel_size, max_new_tokens=settings.max_new_tokens,
        temperature=float(settings.temperature), seed=settings.seed, max_samples=settings.max_samples,
        shards=settings.shards, exclusions=excluded, settings_key=key, requested_by=user)
    # Named for people: the source, the target, how it sampled and the job's number (its page), not a hash.
    sampling = "greedy" if settings.temperature == 0 else f"t{float(settings.temperature):g}"
    job.output_path = str(source.parent / OUTPUT_FOLDER / (f"{_slug(source.stem)}.{_slug(target.name)}.{sampling}"
                                                            f".regeneration-{job.pk}.jsonl"))
    job.save(update_fields=["output_path"])
    if enqueue:
        job_enqueue(job_name="regenerate", record_id=job.pk)
    return job, True


def _again(job: DatasetRegeneration, *, enqueue: bool) -> bool:
    """Queue a job with the same key again when its output is not there to return; True if it was."""
    if job.status == StageStatus.QUEUED:
        if enqueue and pending_enqueue(kind="regenerate", object_id=job.pk) is None:
            job_enqueue(job_name="regenerate", record_id=job.pk)  # the broker may have lost its message
        return False
    if job.status == StageStatus.RUNNING:
        return False
    if job.status == StageStatus.SUCCEEDED and job.dataset_id is not None and Path(job.output_path).is_file():
        return False
    _requeue(job, enqueue=enqueue)
    return True


def _requeue(job: DatasetRegeneration, *, enqueue: bool) -> None:
    # queued_at: it joins the back of its queue now. The file an earlier attempt left is resumed.
    DatasetRegeneration.objects.filter(pk=job.pk).update(
        status=StageStatus.QUEUED, error="", error_trace="", failure_kind="", failure_field="", started_at=None,
        finished_at=None, progress_done=0, progress_total=0, queued_at=timezone.now(), lease_expires_at=None, worker="")
    job.refresh_from_db()
    if enqueue:
        job_enqueue(job_name="regenerate", record_id=job.pk)


def _require_on_job(user: AbstractBaseUser, job: DatasetRegeneration, action: str) -> None:
    """`action` on a regeneration: the site role for it, then (runs.projects.access.rule) its requester or an
    admin; PermissionDenied saying who may."""
    require(user, action)
    if access.user_rule(user, "regeneration", "act") == access.OWNER and job.requested_by_id != user.pk:
        raise PermissionDenied(f"{user.get_username()} may not {action} regeneration {job.pk}: only the one who "
                               "asked for it and admins may")


@transaction.atomic
def regeneration_cancel(*, job: DatasetRegeneration, user: AbstractBaseUser) -> bool:
    """Cancel a queued or running job; a running one stops at its next progress report and keeps the
    conversations it wrote, for a retry to resume. False when it had finished already."""
    _require_on_job(user, job, "cancel")
    return bool(DatasetRegeneration.objects.filter(pk=job.pk).exclude(status__in=FINISHED_STATUSES).update(
        status=StageStatus.CANCELLED, finished_at=timezone.now(), error=f"cancelled by {user.get_username()}",
        lease_expires_at=None))


@transaction.atomic
def regeneration_retry(*, job: DatasetRegeneration, user: AbstractBaseUser) -> bool:
    """Queue a failed or cancelled job again (it resumes its file); False when it was not either."""
    _require_on_job(user, job, "launch")
    job = DatasetRegeneration.objects.select_for_update().get(pk=job.pk)
    if job.status not in (StageStatus.FAILED, StageStatus.CANCELLED):
        return False
    if job.status == StageStatus.FAILED and not job.retryable:
        # Its settings or files caused it (workers.contract.failures): queued again, it fails the same way.
        raise RegenerationRequestError(f"regeneration {job.pk} cannot be retried: {job.headline} A retry with the "
                                       "same target and dataset fails the same way: ask for a new regeneration "
                                       "with the change")
    _requeue(job, enqueue=True)
    return True


@dataclass(frozen=True)
class RegenerationPlan:
    target_dir: Path
    source_path: Path
    output_path: Path
    exclude_ids: frozenset[str]
    exclude_hashes: frozenset[str]
    exclude_own_ids: frozenset[str]


def regeneration_plan(*, job: DatasetRegeneration) -> RegenerationPlan:
    """What the worker reads and writes, each path checked against the data roots again (they may
    have changed since the job was asked for)."""
    exclusions = job.exclusions or {}
    return RegenerationPlan(
        target_dir=check_under_data_roots(job.target.path, kind="target directory"),
        source_path=check_under_data_roots(job.source_path, kind="dataset file"),
        output_path=check_under_data_roots(job.output_path, must_exist=False, kind="regenerated dataset"),
        exclude_ids=frozenset(exclusions.get("ids", [])), exclude_hashes=frozenset(exclusions.get("hashes", [])),
        exclude_own_ids=frozenset(exclusions.get("own_ids", [])))


def regenerated_dataset_name(job: DatasetRegeneration) -> str:
    source = Path(job.source_path).name
    sampled = "greedy" if job.temperature == 0 else f"T={job.temperature:g}, seed {job.seed}"
    return f"{source} regenerated by {job.target.name} ({sampled})"[:200]


@transaction.atomic
def regeneration_record(*, record_id: int, result, log_tail: str, started_at=None) -> Dataset:
    """The worker finished (`result`: workers.stages.regenerate.base.RegenerateResult): register the file it
    wrote as a Dataset whose lineage is this job, record the counts, and catalogue the new file."""
    from runs.pipeline.jobs.services import dataset_catalogue_request
    from runs.pipeline.lifecycle.result_records import result_columns
    from runs.pipeline.lifecycle.stage_services import stage_succeed

    job = DatasetRegeneration.objects.select_related("target").get(pk=record_id)
    path = Path(result.out_path)
    dataset, _ = Dataset.objects.get_or_create(path=str(path), defaults={"name": regenerated_dataset_name(job)})
    dataset.size_bytes = path.stat().st_size
    dataset.save(update_fields=["size_bytes"])
    fields = {**result_columns(DatasetRegeneration, result), "dataset": dataset}
    fields.pop("output_path", None)
    stage_succeed(stage_name="regenerate", record_id=record_id, fields=fields, log_tail=log_tail, started_at=started_at)
    dataset_catalogue_request(dataset=dataset)
    return dataset
