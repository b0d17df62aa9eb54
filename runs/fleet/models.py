"""The workers: one row per Celery worker node, written by its heartbeat (workers/orchestration/fleet.py).

What a worker is doing is not stored here: the running stage rows name their worker and are
fenced by their leases, so the workers page reads busy/idle from them and is never behind.

Kept apart from runs/models.py, which imports this so Django finds it."""
from __future__ import annotations

from django.db import models


class Worker(models.Model):
    """A Celery worker node: what its host can run (GPUs, backends, versions), the queues it
    consumes, and when it last said so. A worker unseen for a while is offline, not deleted."""

    name = models.CharField(max_length=200, unique=True, help_text="Celery node name, e.g. gpu-1@host")
    hostname = models.CharField(max_length=200)
    # workers.contract.host.backends.host_capabilities(): gpus, backends, max_gpus, more_gpus, versions, cpu_count
    capabilities = models.JSONField(default=dict)
    queues = models.JSONField(default=list, help_text="the queues it consumes")
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="set when it shut down cleanly")
    # Its latest sample of itself (main process and pool), written with each heartbeat: cpu_percent (100 =
    # one core), host_cpu_percent, rss_bytes, host_memory_used_bytes/_total_bytes, disk_read/write_bytes_per_s,
    # gpus [{index, util_percent, memory_used_bytes, memory_total_bytes}]; what could not be read is absent.
    system = models.JSONField(default=dict, blank=True,
                              help_text="its latest system sample (workers.orchestration.system_metrics)")
    system_at = models.DateTimeField(null=True, blank=True, help_text="when that sample was taken")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def gpu_count(self) -> int:
        return len(self.capabilities.get("gpus") or [])
