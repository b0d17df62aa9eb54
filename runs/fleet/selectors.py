"""Reads about the fleet: which workers are live and what they do, what a launch may ask of them,
and the queue of work waiting for them.

A worker is live while its heartbeat is recent: it writes one every EAGLE3WEB_STAGE_LEASE_SECONDS/2
(workers/orchestration/fleet.py) and is offline after missing three, or at once when it shut down cleanly."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from runs.fleet.fit import BackendOption, gpus_text, nodes_refusal, queues_text, routed_refusal, said_already, stage_needs, takes, worker_unfit
from runs.fleet.models import Worker
from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.dispatch.launch_order import later_run_ahead
from runs.pipeline.dispatch.queue import run_next_stage
from runs.pipeline.lifecycle.stages import STAGES, STAGES_BY_NAME
from runs.pipeline.online.selectors import capture_text, is_online, train_capture_queue
from runs.pipeline.dispatch.routing import BACKEND_SETTINGS, ROUTED_STAGES, stage_backend, stage_problem, stage_queue
from runs.pipeline.launch.run_config import RunConfig
from workers.contract.host.backends import BACKENDS, BACKENDS_BY_NAME, DEFAULT_GPU_QUEUE, MAX_GPUS, Backend

MISSED_HEARTBEATS = 3


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
    launch_options (their queue follows a backend and GPU count: runs.pipeline.dispatch.routing.ROUTED_STAGES), the
    other stages by whether a live worker takes their queue. With no worker live at all only the default
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
            if stage_name == "train" and not refusal and (refusal := nodes_refusal(config=config, live=live)):
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
