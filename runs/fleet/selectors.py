"""Reads about the fleet: which workers are live and what they do, what a launch may ask of them,
and the queue of work waiting for them.

A worker is live while its heartbeat is recent: it writes one every EAGLE3WEB_STAGE_LEASE_SECONDS/2
(workers/fleet.py) and is offline after missing three, or at once when it shut down cleanly."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from runs.fleet.fit import BackendOption, gpus_text, queues_text, routed_refusal, said_already, stage_needs, takes, worker_unfit
from runs.fleet.models import Worker
from runs.models import FINISHED_STATUSES, PendingEnqueue, PipelineRun, StageStatus, SweepRun
from runs.pipeline.launch_order import later_run_ahead, launch_times
from runs.pipeline.queue import run_next_stage
from runs.pipeline.stages import STAGES, STAGES_BY_NAME

STAGE_NAMES = frozenset(stage.name for stage in STAGES)
from runs.pipeline.online import capture_text, is_online, train_capture_queue
from runs.pipeline.routing import BACKEND_SETTINGS, ROUTED_STAGES, stage_backend, stage_problem, stage_queue
from runs.pipeline.run_config import RunConfig
from runs.projects import access
from workers.contract.backends import BACKENDS, BACKENDS_BY_NAME, DEFAULT_GPU_QUEUE, MAX_GPUS, Backend

MISSED_HEARTBEATS = 3
VERSION_ORDER = ("python", "torch", "transformers", "accelerate", "speculators", "vllm")
MAX_QUEUE_ROWS = 200  # per kind of work; the page says when there are more


def heartbeat_seconds() -> float:
    return max(1.0, settings.EAGLE3WEB_STAGE_LEASE_SECONDS / 2)


def offline_after() -> timedelta:
    return timedelta(seconds=MISSED_HEARTBEATS * heartbeat_seconds())


def workers_live() -> QuerySet[Worker]:
    return Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=timezone.now() - offline_after())


def workers_started(*, names: list[str], since: datetime) -> dict[str, Worker]:
    """Of `names` (node names before the "@", e.g. "cpu" for cpu@host), those with a live worker
    that started at `since` or later, each with its worker: rows an earlier start left do not count."""
    started = workers_live().filter(started_at__gte=since).order_by("-started_at")
    found: dict[str, Worker] = {}
    for worker in started:
        name = worker.name.partition("@")[0]
        if name in names and name not in found:
            found[name] = worker
    return found


# ---- what a launch may ask for ---------------------------------------------------------------

def _unavailable_reason(backend: Backend, live: list[Worker]) -> str:
    """Why no live worker takes any queue of `backend`: none can run it, or those that can do not take it."""
    able = [w for w in live if (w.capabilities or {}).get("backends", {}).get(backend.name, "missing") is None]
    if able:
        return (f"no live worker takes a queue of {backend.label}: "
                + "; ".join(f"{w.name} could run it but takes only {queues_text(w)}" for w in able[:3]))
    reasons = sorted({(w.capabilities or {}).get("backends", {}).get(backend.name)
                      or "it does not report this backend" for w in live})
    return f"no live worker has {backend.label} ({'; '.join(reasons)})"


def launch_options(*, live: list[Worker] | None = None) -> dict[str, BackendOption]:
    """Each backend: on which GPU counts some live worker takes it (runs.fleet.fit.worker_unfit: the
    worker takes that queue and can run it there), and why not more. With no worker live at all the
    default backends stay offered on one device, as before workers reported anything (a demo's
    worker may start after its web server)."""
    live = list(workers_live()) if live is None else live
    options = {}
    for backend in BACKENDS:
        if not live:
            options[backend.name] = BackendOption(
                backend.name, backend.label, backend.stage, backend.default,
                "" if backend.default else f"no worker is live to run {backend.label}",
                1 if backend.default else 0, "no worker is live", (1,) if backend.default else ())
            continue
        # No worker fits more GPUs than its host runs the backend on (one for the defaults): count no further.
        upper = max(((w.capabilities or {}).get("max_gpus") or {}).get(backend.name, 0) for w in live)
        fits = {n: [w for w in live if worker_unfit(w, backend=backend.name, gpus=n) is None]
                for n in range(1, min(max(upper, 1), MAX_GPUS) + 1)}
        counts = tuple(n for n, workers in fits.items() if workers)
        if not counts:
            options[backend.name] = BackendOption(backend.name, backend.label, backend.stage, False,
                                                  _unavailable_reason(backend, live), 0, "", ())
            continue
        most = counts[-1]
        best = fits[most][0]
        if not (best.capabilities or {}).get("gpus"):
            gpu_reason = f"no live worker that runs {backend.label} has a GPU: it runs on the CPU"
        else:
            why_not_more = worker_unfit(best, backend=backend.name, gpus=most + 1) if most < MAX_GPUS else None
            gpu_reason = (f"the largest live worker for {backend.label} ({best.name}) runs it on {gpus_text(most)}"
                          + (f": {why_not_more}" if why_not_more else ""))
        options[backend.name] = BackendOption(backend.name, backend.label, backend.stage, True, "", most, gpu_reason,
                                              counts)
    return options


def stage_refusals(*, config: dict, stage_names: list[str], live: list[Worker] | None = None,
                   weight_bytes: int | None = None) -> list[tuple[str | None, str]]:
    """(field, why) for each of these stages of a run with `config` that no live worker takes and can
    run now; empty when each can. Extraction, training and measuring acceptance are judged by
    launch_options (their queue follows a backend and GPU count: runs.pipeline.routing.ROUTED_STAGES), the other
    stages by whether a live worker takes their queue. With no worker live at all only the default
    backends on one device pass, and the other stages are not judged: a demo's worker may start after
    its web server. `weight_bytes`, the target's (None when unknown, e.g. a config-only directory): a
    GPU backend that loads the target also needs a live worker taking its queue whose GPUs hold it
    (runs.fleet.fit.memory_judged)."""
    live = list(workers_live()) if live is None else live
    options = launch_options(live=live)
    refusals: list[tuple[str | None, str]] = []
    for stage_name in stage_names:
        if stage_name in ROUTED_STAGES:
            refusal = routed_refusal(stage_name=stage_name, config=config, options=options, live=live,
                                     weight_bytes=weight_bytes)
            if refusal and not said_already(refusals, stage_name=stage_name, field=refusal[0]):
                refusals.append(refusal)
            continue
        queue = stage_queue(stage_name=stage_name, config=config)
        if live and not any(takes(w, queue) for w in live):
            taken = sorted({q for w in live for q in w.queues or []})
            refusals.append((None, f"the {STAGES_BY_NAME[stage_name].label.lower()} stage goes to queue {queue}, which "
                                   f"no live worker takes (they take {', '.join(taken) or 'no queue'})"))
    return sorted(refusals, key=lambda refusal: refusal[0] is None)  # a field's first: the form marks it


def launch_refusals(*, config: RunConfig, live: list[Worker] | None = None, weight_bytes: int | None = None
                    ) -> list[tuple[str | None, str]]:
    """stage_refusals for every stage of a run about to be launched with `config`."""
    return stage_refusals(config=config.as_dict(), stage_names=[stage.name for stage in STAGES], live=live,
                          weight_bytes=weight_bytes)


def run_backends(*, config: dict) -> list[dict]:
    """The backend and GPU count each of a run's extraction and training ran (or will run) with."""
    chosen = []
    for stage_name in BACKEND_SETTINGS:
        backend, gpus = stage_backend(stage_name=stage_name, config=config or {})
        if stage_name == "extract" and is_online(config):  # nothing extracted: training asks capture servers
            chosen.append({"stage": stage_name, "backend": "online", "gpus": 0, "default": False,
                           "label": f"none: online, {capture_text(config)}"})
            continue
        known = BACKENDS_BY_NAME.get(backend)
        chosen.append({"stage": stage_name, "backend": backend, "label": known.label if known else backend,
                       "gpus": gpus, "default": bool(known and known.default and gpus == 1)})
    return chosen


def stage_queue_notes(*, run: PipelineRun) -> dict[str, dict]:
    """For each queued stage of `run` that no live worker takes, what it waits for and what to do
    ({"text", "copy": whether launching a copy with another backend helps}): otherwise the run page
    shows it queued for ever without a word."""
    live = list(workers_live())
    config = run.config or {}
    notes = {}
    for stage in STAGES:
        record = getattr(run, stage.related_name, None)
        if record is None or record.status != StageStatus.QUEUED:
            continue
        if problem := stage_problem(stage_name=stage.name, config=config):
            notes[stage.name] = {"text": f"{problem} (no worker takes it): cancel and launch a copy with another "
                                         "backend", "copy": True}
            continue
        queue = stage_queue(stage_name=stage.name, config=config)
        if any(takes(w, queue) for w in live):
            if run_next_stage(run_id=run.pk) == stage.name and (ahead := later_run_ahead(run=run, stage_name=stage.name)):
                # The page is one body for all who see this run: a run of another project is not named
                # (its viewers may not see it; the project wall answers it as if it did not exist).
                behind = f"run {ahead['run_id']}'s" if ahead["same_project"] else "another run's"
                notes[stage.name] = {"text": (
                    f"waits behind {behind} {ahead['label'].lower()} stage, launched later, which "
                    f"{ahead['worker'] or 'a worker'} took from {queue} while this stage was not ready yet: a worker "
                    "never sits idle for a stage that is not ready; this one goes next in launch order"), "copy": False}
            continue
        routed = stage.name in ROUTED_STAGES and queue != DEFAULT_GPU_QUEUE
        if stage.name == "train" and queue == train_capture_queue(config):
            todo = (f"its training starts vLLM capture servers, so it needs a worker with vLLM taking {queue}: "
                    "start one, or cancel and launch a copy that names running capture servers (capture URLs)")
            notes[stage.name] = {"text": f"waiting in queue {queue}, which no live worker takes: {todo}", "copy": True}
            continue
        if routed:
            backend, gpus = stage_backend(stage_name=stage.name, config=config)
            # Nobody chose measuring acceptance's backend: say why it needs these GPUs (the extraction's
            # count), and that a copy on fewer of them, not another backend, is what would help.
            needs = stage_needs(stage_name=stage.name, backend=backend, gpus=gpus)
            todo = (f"{needs + '; ' if needs else ''}start a worker with {BACKENDS_BY_NAME[backend].label} on "
                    f"{gpus_text(gpus)}, or cancel and launch a copy with {'fewer GPUs' if needs else 'another backend'}")
        elif queue == DEFAULT_GPU_QUEUE:
            todo = "start a worker that takes gpu (make worker does, as does every worker on a GPU host)"
        else:
            todo = f"start a worker that takes {queue} (make worker does: -Q cpu,gpu)"
        notes[stage.name] = {"text": f"waiting in queue {queue}, which no live worker takes: {todo}", "copy": routed}
    return notes


# ---- the workers page ------------------------------------------------------------------------

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
        """Its latest system sample (workers.system_metrics), {} when it has none; a live worker's is its now
        (one heartbeat old at most), an offline one's is what it last said."""
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


# The columns a job's queue depends on (runs.pipeline.queue.job_queue), read with its row.
JOB_QUEUE_FIELDS = {"serve_check": ("tensor_parallel_size",), "regenerate": ("backend", "tensor_parallel_size")}


def _job_row_queue(job_name: str, row) -> str:
    """The queue runs.pipeline.queue.job_queue sent this job to, from the row in hand."""
    from workers.contract.backends import stage_queue as backend_queue

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
    seen = _seen(user, [("run", row["run_id"]) if row.get("run_id") is not None else _job_subject(kind.name, row)
                        for kind, row in found])
    doing: dict[str, list[dict]] = defaultdict(list)
    for kind, row in found:
        run_seen = ("run", row.get("run_id")) in seen
        subject_seen = row.get("run_id") is None and kind.name in JOB_SUBJECTS and _job_subject(kind.name, row) in seen
        doing[row["worker"]].append({"stage": kind.name, "label": kind.label, "record_id": row["pk"],
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
    those stages in their runs' launch order (runs.pipeline.launch_order); jobs keep theirs."""
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
    # Hand-overs the broker refused (runs.pipeline.queue keeps them and the workers retry); a fresh row is
    # being sent after its commit and is no news.
    outbox = list(PendingEnqueue.objects.filter(attempts__gt=0).order_by("pk")[:MAX_QUEUE_ROWS])
    held = SweepRun.objects.filter(released_at__isnull=True).count()
    return {"items": items, "outbox": outbox, "blocked": blocked, "more": more, "held_by_sweeps": held}
