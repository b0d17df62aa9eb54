"""A worker's part in the fleet: at start it probes what its host can run, adds the queues its
GPUs serve, and from then on writes a heartbeat (runs.fleet.models.Worker) with its capabilities,
queues and a sample of its CPU, memory, GPU and disk (workers.orchestration.system_metrics) every
EAGLE3WEB_STAGE_LEASE_SECONDS/2; a clean shutdown says so at once.

Queues (workers.contract.host.backends): a worker consumes what -Q gives it ("cpu" when no -Q is given)
and, on a host with GPUs, also "gpu" plus "<backend>.<n>" for every backend it can run on n GPUs,
so that `celery -A eagle3web worker --concurrency 1` on a GPU host takes GPU stages with no -Q.
EAGLE3WEB_WORKER_GPU_QUEUES=0 turns that off: the worker then takes exactly its -Q queues (e.g. to
keep a GPU host for vLLM alone: -Q vllm.1,vllm.2). CUDA_VISIBLE_DEVICES limits the GPUs it sees,
so one host can run a worker per GPU group, each with its own node name (-n).

Imported by workers/orchestration/tasks.py, so that every worker connects these signals.
"""
from __future__ import annotations

import logging
import socket
import threading

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from runs.fleet.selectors import heartbeat_seconds
from runs.fleet.services import worker_heartbeat, worker_stopped
from workers.contract.host.backends import host_capabilities_isolated, host_queues
from workers.orchestration.system_metrics import SystemMeter

logger = logging.getLogger(__name__)

# This worker process's node: filled at start, read by its heartbeat.
_node: dict = {}


@celeryd_after_setup.connect
def _probe_host_and_add_queues(sender, instance, **_kwargs) -> None:
    try:
        # In a child process: CUDA initialised here would break the forked pool's stages.
        capabilities = host_capabilities_isolated()
    except Exception as exc:  # noqa: BLE001 - a broken driver must show on the workers page, not stop the worker
        logger.exception("could not probe this host's GPUs and backends")
        capabilities = {"hostname": socket.gethostname(), "gpus": [], "backends": {}, "max_gpus": {},
                        "probe_error": str(exc)[:2000]}
    queues = instance.app.amqp.queues
    if settings.EAGLE3WEB_WORKER_GPU_QUEUES:
        for name in host_queues(capabilities):
            queues.select_add(name)
    consumed = sorted(queues.consume_from if queues.consume_from is not None else queues)
    _node.update(name=sender, hostname=capabilities.get("hostname") or socket.gethostname(),
                 capabilities=capabilities, queues=consumed, started_at=timezone.now())
    logger.info("worker %s: %d GPU(s), consumes %s", sender, len(capabilities.get("gpus") or []), ", ".join(consumed))


def node_capabilities() -> dict | None:
    """What this worker's host can run (its GPUs, as torch found them in the probe's child process), as
    probed at the worker's start; a forked pool process inherits it. None outside a started worker."""
    return _node.get("capabilities")


class WorkerHeartbeat(threading.Thread):
    """Says every heartbeat_seconds() that this worker is alive and what it can run; a database
    away for a while only delays it."""

    def __init__(self, node: dict):
        super().__init__(name="worker-heartbeat", daemon=True)
        self.node = dict(node)
        self.stopped = threading.Event()
        self.meter: SystemMeter | None = None

    def _system(self) -> dict | None:
        """This worker's figures now (its main process and pool, workers.orchestration.system_metrics); None when
        unreadable."""
        try:
            self.meter = self.meter or SystemMeter()
            return self.meter.sample()
        except Exception:  # noqa: BLE001 - a beat without figures still says the worker is alive
            logger.warning("could not sample this worker's system figures", exc_info=True)
            return None

    def beat(self) -> None:
        worker_heartbeat(**self.node, system=self._system())

    def run(self) -> None:
        period = heartbeat_seconds()
        try:
            while True:
                try:
                    close_old_connections()
                    self.beat()
                except Exception:  # noqa: BLE001 - the page shows the worker offline until the next beat lands
                    logger.warning("worker heartbeat failed; trying again in %.0f s", period, exc_info=True)
                if self.stopped.wait(period):
                    return
        finally:
            connection.close()


_heartbeat: list[WorkerHeartbeat] = []


@worker_ready.connect
def _start_heartbeat(**_kwargs) -> None:
    if not _node:
        return  # not a `celery worker` start (celeryd_after_setup did not run)
    heartbeat = WorkerHeartbeat(_node)
    _heartbeat.append(heartbeat)
    heartbeat.start()


@worker_shutdown.connect
def _say_stopped(**_kwargs) -> None:
    if not _node:
        return
    for heartbeat in _heartbeat:
        heartbeat.stopped.set()
        heartbeat.join(timeout=10)  # a beat landing after the goodbye would show the worker live again
    try:
        close_old_connections()
        worker_stopped(name=_node["name"])
    except Exception:  # noqa: BLE001 - shutting down anyway; the missed heartbeats tell the same later
        logger.warning("could not record that worker %s stopped", _node["name"], exc_info=True)
    finally:
        connection.close()
