"""Writes the workers make about themselves: a heartbeat with what they can run, and a goodbye."""
from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from django.utils import timezone

from runs.fleet.models import Worker


def worker_heartbeat(*, name: str, hostname: str, capabilities: dict, queues: list[str],
                     started_at: datetime, system: dict | None = None) -> Worker:
    """Record that worker `name` is alive now, with what its host can run, the queues it takes and its
    latest system sample (workers.orchestration.system_metrics; None: it could not sample, the last one stays).
    A worker that restarts under the same node name takes its row over."""
    defaults = {"hostname": hostname[:200], "capabilities": capabilities, "queues": list(queues),
                "started_at": started_at, "last_seen": timezone.now(), "stopped_at": None}
    if system is not None:
        defaults.update(system=system, system_at=datetime.fromtimestamp(system["time"], tz=dt_timezone.utc))
    worker, _ = Worker.objects.update_or_create(name=name[:200], defaults=defaults)
    return worker


def worker_stopped(*, name: str) -> int:
    """The worker shut down cleanly: it shows as offline at once instead of after missed heartbeats."""
    return Worker.objects.filter(name=name[:200]).update(stopped_at=timezone.now())
