"""What the workers page reads: each worker and what it runs, and what waits in each queue, in the
order the queues hand it out; work of a run or subject the viewer does not see keeps its place, unnamed
(runs.projects.access)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from runs.fleet.fit import takes
from runs.fleet.models import Worker
from runs.fleet.selectors import offline_after, workers_live
from runs.pipeline.models import PendingEnqueue, PipelineRun
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES, StageStatus
from runs.pipeline.nodes.selectors import worker_ranks
from runs.pipeline.dispatch.launch_order import launch_times
from runs.pipeline.shards.models import StageShard
from runs.pipeline.dispatch.routing import stage_problem, stage_queue
from runs.pipeline.lifecycle.stages import STAGES, STAGES_BY_NAME
from runs.projects import access
from workers.contract.host.backends import BACKENDS

STAGE_NAMES = frozenset(stage.name for stage in STAGES)
VERSION_ORDER = ("python", "torch", "transformers", "accelerate", "speculators", "vllm")
MAX_QUEUE_ROWS = 200  # per kind of work; the page says when there are more

@dataclass
class WorkerRow:
    worker: Worker
    status: str  # busy, idle or offline
    doing: list[dict] = field(default_factory=list)  # the stage rows running on it

    @property
    def gpu_groups(self) -> list[dict]:
        """The GPUs, alike ones counted together ("8 x NVIDIA H100 80GB HBM3, 80 GB each")."""
        groups: dict[tuple, int] = {}
        for gpu in self.worker.capabilities.get("gpus") or []:
            key = (gpu.get("name", "?"), gpu.get("memory_bytes", 0))
            groups[key] = groups.get(key, 0) + 1
        return [{"count": count, "name": name, "memory_bytes": memory} for (name, memory), count in groups.items()]

    @property
    def versions(self) -> list[tuple[str, str | None]]:
        """(name, version) in VERSION_ORDER; vLLM's with its build and where it lives ("0.32.0+cpu (cpu
        build, /srv/eagle3web/.venv-vllm/bin/vllm)"): it runs from an environment of its own."""
        versions = self.worker.capabilities.get("versions") or {}
        vllm = self.worker.capabilities.get("vllm") or {}
        shown = []
        for name in VERSION_ORDER:
            if name not in versions:
                continue
            version = versions.get(name)
            if name == "vllm" and version and vllm.get("build"):
                version = f"{version} ({vllm['build']} build, {vllm.get('executable', '?')})"
            shown.append((name, version))
        return shown

    @property
    def system(self) -> dict:
        """Its latest system sample (workers.orchestration.system_metrics), {} when it has none; a live worker's is its
        now (one heartbeat old at most), an offline one's is what it last said."""
        return self.worker.system if self.worker.system_at else {}

    @property
    def backends(self) -> list[dict]:
        caps = self.worker.capabilities
        return [{"name": b.name, "label": b.label, "stage": b.stage,
                 "reason": caps.get("backends", {}).get(b.name, "not reported"),
                 "max_gpus": caps.get("max_gpus", {}).get(b.name, 0),
                 "more_gpus": caps.get("more_gpus", {}).get(b.name)} for b in BACKENDS]


def _has_run(model) -> bool:
    return any(f.name == "run" for f in model._meta.get_fields())


# What each job works on, and its page: (the job row's foreign key, the URL name of that page).
JOB_SUBJECTS = {"catalogue": ("dataset_id", "runs:dataset_detail"), "verify": ("extraction_id", "runs:extraction_detail"),
                "serve_check": ("checkpoint_id", "runs:checkpoint_detail"),
                "regenerate": ("source_id", "runs:dataset_detail"),
                # A measurement asked for on a checkpoint (no run): its subject is the checkpoint.
                "evaluate": ("checkpoint_id", "runs:checkpoint_detail")}


# The columns a job's queue depends on (runs.pipeline.dispatch.queue.job_queue), read with its row.
JOB_QUEUE_FIELDS = {"serve_check": ("tensor_parallel_size",), "regenerate": ("backend", "tensor_parallel_size")}


def _job_row_queue(job_name: str, row) -> str:
    """The queue runs.pipeline.dispatch.queue.job_queue sent this job to, from the row in hand."""
    from workers.contract.host.backends import stage_queue as backend_queue

    if job_name == "serve_check":
        return backend_queue(backend="vllm", gpus=row.tensor_parallel_size or 1)
    if job_name == "regenerate":
        return backend_queue(backend=row.backend, gpus=row.tensor_parallel_size or 1)
    return STAGES_BY_NAME[job_name].queue


def _subject_url(job_name: str, row) -> str:
    """The page of the dataset or extraction a job works on ("" for a run's stage)."""
    if job_name not in JOB_SUBJECTS:
        return ""
    field, url_name = JOB_SUBJECTS[job_name]
    subject_id = row[field] if isinstance(row, dict) else getattr(row, field)
    return reverse(url_name, args=[subject_id]) if subject_id is not None else ""  # its subject was deleted


# What each job's subject is, in the one rule's words (runs.projects.access.KINDS).
JOB_SUBJECT_KINDS = {"catalogue": "dataset", "verify": "extraction", "serve_check": "checkpoint", "regenerate": "dataset",
                     "evaluate": "checkpoint"}


def _subject_fields(job_name: str) -> list[str]:
    """The column naming a job's subject; none for a job with no subject (the demo build)."""
    return [JOB_SUBJECTS[job_name][0]] if job_name in JOB_SUBJECTS else []


def _job_subject(job_name: str, row) -> tuple[str, int | None]:
    """(kind, id) of a job's subject for _seen; ("", None), seen by nobody, for a job with none."""
    if job_name not in JOB_SUBJECTS:
        return "", None
    field = JOB_SUBJECTS[job_name][0]
    return JOB_SUBJECT_KINDS[job_name], row[field] if isinstance(row, dict) else getattr(row, field)


def _seen(user, found: list[tuple[str, int | None]]) -> set[tuple[str, int]]:
    """Which of these (kind, id) the user sees (one query per kind): a run's or a job's subject another
    project's is named to nobody outside it. `user` None: everything (a command's or a test's read)."""
    by_kind: dict[str, set[int]] = defaultdict(set)
    for kind, pk in found:
        if pk is not None:
            by_kind[kind].add(pk)
    if user is None:
        return {(kind, pk) for kind, ids in by_kind.items() for pk in ids}
    return {(kind, pk) for kind, ids in by_kind.items() for pk in access.visible_ids(kind, ids, user)}


def _running_by_worker(names: list[str], user=None) -> dict[str, list[dict]]:
    """The running stage and job rows of these workers: one query per kind of work, not per worker. The run
    and subject of work the user does not see are left out (its stage and progress are shown)."""
    found = []
    for kind in STAGES_BY_NAME.values():
        extra = (["run_id", "run__name"] if _has_run(kind.model) else []) + _subject_fields(kind.name)
        rows = kind.model.objects.filter(status=StageStatus.RUNNING, worker__in=names).values(
            "pk", "worker", "started_at", "progress_done", "progress_total", *extra)
        found += [(kind, row) for row in rows]
    # A shard of a stage split over many workers (runs.pipeline.shards.models): its worker holds that shard.
    for shard in StageShard.objects.filter(status=StageStatus.RUNNING, worker__in=names).select_related("run"):
        kind = STAGES_BY_NAME[shard.stage]
        found.append((kind, {"pk": shard.record_id, "worker": shard.worker, "started_at": shard.started_at,
                             "progress_done": shard.rows_done, "progress_total": shard.rows, "run_id": shard.run_id,
                             "run__name": shard.run.name if shard.run else "",
                             "shard": f"shard {shard.index} ({shard.span_label})"}))
    # A training across nodes: its rank 0 is the stage's worker; the other ranks' workers hold no stage row.
    ranks = worker_ranks(worker_names=names)
    train = STAGES_BY_NAME["train"]
    for name, held in ranks.items():
        if held["rank"]:
            found.append((train, {"pk": held["training_id"], "worker": name, "started_at": held["since"],
                                  "progress_done": 0, "progress_total": 0, "run_id": held["run_id"],
                                  "run__name": held["run_name"]}))
    # (A job's shard names no subject here: its job's page is reached from the job.)
    seen = _seen(user, [("run", row["run_id"]) if row.get("run_id") is not None else
                        ("shard", None) if row.get("shard") else _job_subject(kind.name, row) for kind, row in found])
    doing: dict[str, list[dict]] = defaultdict(list)
    for kind, row in found:
        run_seen = ("run", row.get("run_id")) in seen
        subject_seen = (row.get("run_id") is None and kind.name in JOB_SUBJECTS and not row.get("shard")
                        and _job_subject(kind.name, row) in seen)
        held = ranks.get(row["worker"]) if kind is train and not row.get("shard") else None
        label = (f"{kind.label}, {row['shard']}" if row.get("shard") else
                 f"{kind.label}, rank {held['rank']} of {held['nodes']}" if held else kind.label)
        doing[row["worker"]].append({"stage": kind.name, "label": label, "record_id": row["pk"],
                                     "run_id": row.get("run_id") if run_seen else None,
                                     "run_name": (row.get("run__name") or "") if run_seen else "",
                                     "subject_url": _subject_url(kind.name, row) if subject_seen else "",
                                     "since": row["started_at"], "done": row["progress_done"],
                                     "total": row["progress_total"]})
    return doing


def worker_rows(user=None) -> list[WorkerRow]:
    """Every worker that ever reported, live ones first, each busy (with what), idle or offline; what it
    works on named only where `user` sees it."""
    workers = list(Worker.objects.all())
    doing = _running_by_worker([w.name for w in workers], user)
    cutoff = timezone.now() - offline_after()
    rows = []
    for w in workers:
        live = w.stopped_at is None and w.last_seen >= cutoff
        status = ("busy" if doing.get(w.name) else "idle") if live else "offline"
        rows.append(WorkerRow(worker=w, status=status, doing=doing.get(w.name, [])))
    order = {"busy": 0, "idle": 1, "offline": 2}
    return sorted(rows, key=lambda r: (order[r.status], r.worker.name))


@dataclass
class QueuedWork:
    kind: str
    label: str
    record_id: int
    run_id: int | None
    run_name: str
    queue: str
    queued_at: datetime  # when it joined its queue (see queued_work)
    waits_for: str  # an earlier stage of its run still to finish, "" when it is in its queue
    taken_by: list[str]  # live workers that consume its queue
    problem: str = ""  # why no worker ever takes it (an unknown backend in its run's config), "" when none
    ahead: int = 0  # work in the same queue before it: 0 is the head, what a worker takes next
    subject_url: str = ""  # a job's dataset or extraction page ("" for a run's stage)


def _in_launch_order(items: list[QueuedWork], *, launched: dict, runs: dict) -> None:
    """Within each queue, the turns that runs' stages hold (their messages, first in, first out) go to
    those stages in their runs' launch order (runs.pipeline.dispatch.launch_order); jobs keep theirs."""
    keys = {id(item): (launched[run.pk], run.pk) for item in items if (run := runs.get(id(item))) is not None}
    slots: dict[str, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        if id(item) in keys and item.kind in STAGE_NAMES and not item.waits_for:
            slots[item.queue].append(index)
    for indexes in slots.values():
        for index, item in zip(indexes, sorted((items[i] for i in indexes), key=lambda item: keys[id(item)])):
            items[index] = item


def queued_work(user=None) -> dict:
    """What waits for a worker, in the order each queue hands it out: each queued stage and job with
    the queue it goes to, its place there and whether a live worker takes that queue; plus what the
    broker has not taken yet (the outbox) and how many stages sit behind a failed or cancelled one
    (they wait for a retry, not a worker).

    A queue is first in, first out (Redis), and a run's chain sends a stage to its queue when the
    stage before it finishes: a stage joined its queue at the later of its row's queued_at (set again
    by a retry or a lost lease) and the finish of the stages before it, not when its run was created.
    Work of a run or on a subject `user` does not see keeps its place in the queue, unnamed."""
    queued, more = [], False
    for index, kind in enumerate(STAGES_BY_NAME.values()):
        with_run = _has_run(kind.model)
        rows = kind.model.objects.filter(status=StageStatus.QUEUED).order_by("queued_at", "pk")
        if with_run:  # a run its sweep holds back is in no queue yet (runs.sweeps.release): counted below
            rows = rows.filter(Q(run__sweep_entry__isnull=True) | Q(run__sweep_entry__released_at__isnull=False))
        rows = rows.select_related("run").only("pk", "queued_at", "run__name", "run__config", *_subject_fields(kind.name)) \
            if with_run else rows.only("pk", "queued_at", *_subject_fields(kind.name), *JOB_QUEUE_FIELDS.get(kind.name, ()))
        rows = list(rows[:MAX_QUEUE_ROWS + 1])
        more = more or len(rows) > MAX_QUEUE_ROWS
        for row in rows[:MAX_QUEUE_ROWS]:
            run = row.run if with_run else None
            queued.append((index, kind, row, run))
    run_ids = {run.pk for _, _, _, run in queued if run is not None}
    statuses: dict[int, dict[str, str]] = defaultdict(dict)
    finished: dict[int, dict[str, datetime | None]] = defaultdict(dict)
    for stage in STAGES:
        for run_id, status, finished_at in stage.model.objects.filter(run_id__in=run_ids).values_list(
                "run_id", "status", "finished_at"):
            statuses[run_id][stage.name] = status
            finished[run_id][stage.name] = finished_at
    live = list(workers_live())
    names = [stage.name for stage in STAGES]
    seen = _seen(user, [("run", run.pk) if run is not None else _job_subject(kind.name, row)
                        for _, kind, row, run in queued])
    items, blocked, runs_of = [], 0, {}
    for index, kind, row, run in queued:
        waits_for, joined = "", row.queued_at
        if run is not None and kind.name in names:
            earlier = [(n, statuses[run.pk].get(n)) for n in names[:names.index(kind.name)]]
            if any(s in FINISHED_STATUSES and s != StageStatus.SUCCEEDED for _, s in earlier):
                blocked += 1
                continue
            waits_for = next((n for n, s in earlier if s != StageStatus.SUCCEEDED), "")
            joined = max([row.queued_at, *(f for n, _ in earlier if (f := finished[run.pk].get(n)))])
        config = (run.config if run is not None else None) or {}
        queue = stage_queue(stage_name=kind.name, config=config) if run is not None else _job_row_queue(kind.name, row)
        shown = run is not None and ("run", run.pk) in seen
        subject_seen = run is None and _job_subject(kind.name, row) in seen
        items.append(QueuedWork(kind=kind.name, label=kind.label, record_id=row.pk,
                                run_id=run.pk if shown else None, run_name=str(run) if shown else "",
                                queue=queue, queued_at=joined,
                                waits_for=waits_for, taken_by=[w.name for w in live if takes(w, queue)],
                                problem=stage_problem(stage_name=kind.name, config=config),
                                subject_url=_subject_url(kind.name, row) if subject_seen else ""))
        runs_of[id(items[-1])] = run
    items.sort(key=lambda item: (item.waits_for != "", item.queued_at, names.index(item.kind)
                                 if item.kind in names else len(names), item.record_id))
    _in_launch_order(items, launched=launch_times(run_ids=run_ids), runs=runs_of)
    in_queue: dict[str, int] = defaultdict(int)
    for item in items:
        if not item.waits_for:  # what waits behind an earlier stage is in no queue yet
            item.ahead = in_queue[item.queue]
            in_queue[item.queue] += 1
    # Hand-overs the broker refused (runs.pipeline.dispatch.queue keeps them and the workers retry); a fresh row is
    # being sent after its commit and is no news.
    outbox = list(PendingEnqueue.objects.filter(attempts__gt=0).order_by("pk")[:MAX_QUEUE_ROWS])
    # A sweep's runs not yet handed over (runs.sweeps.release), from the index on released_at. Without
    # `sweep_entry__isnull=False` the outer join took every run of no sweep for a held one (100,000 at 100,000 runs).
    held = PipelineRun.objects.filter(sweep_entry__isnull=False, sweep_entry__released_at__isnull=True).count()
    return {"items": items, "outbox": outbox, "blocked": blocked, "more": more, "held_by_sweeps": held}
