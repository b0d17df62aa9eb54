"""The workers page as JSON (GET /api/v1/workers/), from the fleet's selectors."""
from __future__ import annotations

from runs.fleet.selectors import launch_options
from runs.fleet.work_selectors import queued_work, worker_rows


def fleet_summary(*, user) -> dict:
    """The workers page as JSON (GET /api/v1/workers/): each worker, what a launch can ask for, the queue;
    the runs and subjects of work named only where `user` sees them (runs.projects.access)."""
    queue = queued_work(user)
    return {
        "workers": [{"name": r.worker.name, "hostname": r.worker.hostname, "status": r.status,
                     "last_seen": r.worker.last_seen.isoformat(), "started_at": r.worker.started_at.isoformat(),
                     "queues": r.worker.queues, "gpus": r.worker.capabilities.get("gpus") or [],
                     "backends": r.backends, "versions": dict(r.versions),
                     "system": r.system or None,
                     "system_at": r.worker.system_at.isoformat() if r.worker.system_at else None,
                     "doing": [{**d, "since": d["since"].isoformat() if d["since"] else None} for d in r.doing]}
                    for r in worker_rows(user)],
        "launch_options": {name: {"label": o.label, "stage": o.stage, "available": o.available, "reason": o.reason,
                                  "max_gpus": o.max_gpus, "gpu_counts": list(o.gpu_counts),
                                  "gpu_reason": o.gpu_reason}
                           for name, o in launch_options().items()},
        "queue": [{"kind": i.kind, "record_id": i.record_id, "run_id": i.run_id, "queue": i.queue,
                   "waits_for": i.waits_for or None, "taken_by": i.taken_by, "problem": i.problem or None,
                   "ahead": None if i.waits_for else i.ahead, "queued_at": i.queued_at.isoformat()}
                  for i in queue["items"]],
        "refused_by_broker": [{"kind": p.kind, "object_id": p.object_id, "attempts": p.attempts,
                               "last_error": p.last_error} for p in queue["outbox"]],
        "waiting_for_retry": queue["blocked"],
        "held_by_sweeps": queue["held_by_sweeps"],
    }
