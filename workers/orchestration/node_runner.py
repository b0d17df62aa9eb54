"""A worker's part in a training across nodes (a run's train_nodes > 1): holding a rank, waiting for the
gang, running the node's torchrun (workers.stages.train.processes.nodes) and recording how its rank ended.

The stage's own worker leads (training_lead): it holds rank 0, opens the attempt's rows and sends the
other ranks' messages (runs.pipeline.nodes.services); the training's callbacks (progress, metrics,
checkpoints, resume) run there alone. Each other rank's worker runs node_train from its message
(workers.orchestration.tasks.train_rank_task). Waiting for the gang happens here, in the worker, before torchrun or
CUDA start, so no rank holds a GPU while it waits: at most EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS, after
which rank 0 fails the stage naming the missing ranks. While torchrun runs, every rank's worker checks
the others about twice a second (node_services.gang_broken) and stops its own torchrun when the gang broke.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection

from eagle3web.db import db_retry
from runs.pipeline.nodes.services import (
    Status,
    gang_broken,
    gang_give_up,
    gang_missing,
    gang_place,
    node_heartbeat,
    node_mark,
    nodes_open,
)

logger = logging.getLogger(__name__)

WAIT_POLL_SECONDS = 0.5
WATCH_SECONDS = 0.5


class GangBroken(RuntimeError):
    """Another rank of this training failed or was lost, or the attempt ended: this rank stopped too."""


class GangIncomplete(RuntimeError):
    """Not every rank's worker joined within the gang timeout."""


class _Lines(logging.Handler):
    """The node's own log tail (torchrun's lines, the rank's training log), for its row."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=120)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class _Heartbeat(threading.Thread):
    def __init__(self, node_id: int):
        super().__init__(name=f"node-heartbeat-{node_id}", daemon=True)
        self.node_id, self.stopped = node_id, threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(max(0.5, settings.EAGLE3WEB_STAGE_LEASE_SECONDS / 3)):
                try:
                    node_heartbeat(node_id=self.node_id)
                except Exception:  # noqa: BLE001 - the database away for a while: keep trying
                    logger.warning("rank heartbeat could not renew its lease", exc_info=True)
                    close_old_connections()
        finally:
            connection.close()


def _watcher(node_id: int):
    last = [0.0]

    def watch() -> None:
        if time.monotonic() - last[0] < WATCH_SECONDS:
            return
        last[0] = time.monotonic()
        if reason := db_retry("gang", gang_broken, node_id=node_id):
            raise GangBroken(f"this rank stopped: {reason}")
    return watch


def _gang_wait(node_id: int, *, lead: bool) -> None:
    """Until every rank is held: rank 0 gives up after the gang timeout, naming the missing ranks; the
    others wait as long as the attempt lasts (rank 0's give-up ends it)."""
    timeout = settings.EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS
    deadline = time.monotonic() + timeout
    watch = _watcher(node_id)
    while missing := db_retry("gang", gang_missing, node_id=node_id):
        if lead and time.monotonic() > deadline:
            raise GangIncomplete(db_retry("gang", gang_give_up, node_id=node_id, missing=missing, seconds=timeout))
        watch()
        time.sleep(WAIT_POLL_SECONDS)


def _run_node(*, place, backend: str, gpus: int, watch, arguments: dict):
    """Our loop's node (workers.stages.train.processes.nodes), or speculators' Trainer under the same torchrun options:
    speculators runs its own DDP/FSDP over the ranks; `watch` is asked as its stop request."""
    from workers.stages.train.processes.nodes import torchrun_args, train_on_node

    if backend != "speculators":
        return train_on_node(place=place, watch=watch, **arguments)
    from workers.stages.train.with_speculators.trainer import train_with_speculators

    asked = arguments.pop("should_stop", None)

    def should_stop() -> bool:
        watch()  # a broken gang raises GangBroken, which stops the trainer's torchrun
        return bool(asked and asked())
    return train_with_speculators(**arguments, num_gpus=gpus, extra_args=settings.EAGLE3WEB_SPECULATORS_ARGS,
                                  node_args=torchrun_args(place, nproc_per_node=gpus), should_stop=should_stop)


def _other_rank_failed(node_id: int, *, within: float = 15.0) -> str | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        reason = db_retry("gang", gang_broken, node_id=node_id)
        if reason and reason.startswith("rank ") and "GangBroken" not in reason:  # its own cause, not ours
            return reason
        time.sleep(WAIT_POLL_SECONDS)
    return None


def node_train(*, node_id: int, arguments: dict, backend: str, gpus: int, lead: bool = False):
    """Run this worker's rank: wait for the gang, then its torchrun; the training's result on rank 0's
    node (None elsewhere). The row ends succeeded or failed, with the node's log tail."""
    from workers.stages.train.processes.nodes import NodePlace

    lines = _Lines()
    watched = [logging.getLogger("workers"), logging.getLogger("speculators")]
    for log in watched:
        log.addHandler(lines)
    heartbeat = _Heartbeat(node_id)
    heartbeat.start()
    try:
        _gang_wait(node_id, lead=lead)
        place = db_retry("gang", gang_place, node_id=node_id)
        logger.info("rank %d of %d: the gang is complete; starting torchrun (rendezvous %s)", place["rank"],
                    place["nodes"], place["endpoint"])
        db_retry("rank", node_mark, node_id=node_id, status=Status.RUNNING)
        result = _run_node(place=NodePlace(**place, join_timeout=settings.EAGLE3WEB_TRAIN_GANG_TIMEOUT_SECONDS),
                           backend=backend, gpus=gpus, watch=_watcher(node_id), arguments=arguments)
        db_retry("rank", node_mark, node_id=node_id, status=Status.SUCCEEDED, log_tail="\n".join(lines.lines))
        return result
    except BaseException as exc:
        db_retry("rank", node_mark, node_id=node_id, status=Status.FAILED, log_tail="\n".join(lines.lines),
                 error=f"{type(exc).__name__}: {exc}")
        if lead and isinstance(exc, Exception) and not isinstance(exc, (GangBroken, GangIncomplete)):
            # A rank that died shows here first as this rank's collective failing: name the rank that
            # died, as soon as its worker has said so.
            if reason := _other_rank_failed(node_id):
                raise GangBroken(f"{reason}; this rank's training then ended: {type(exc).__name__}: {exc}") from exc
        raise
    finally:
        heartbeat.stopped.set()
        for log in watched:
            log.removeHandler(lines)


def training_lead(*, record, worker: str, started_at, nodes: int, backend: str, gpus: int, arguments: dict):
    """The stage's worker: rank 0 of a new attempt (see the module's note); the training's result."""
    from workers.stages.train.processes.nodes import free_port, rendezvous_host

    host = rendezvous_host()
    node_id = db_retry("gang", nodes_open, training_id=record.pk, stage_started_at=started_at, nodes=nodes,
                       worker=worker, host=host, endpoint=f"{host}:{free_port()}")
    logger.info("training across %d nodes: this worker holds rank 0; the other ranks' messages are queued", nodes)
    return node_train(node_id=node_id, arguments=arguments, backend=backend, gpus=gpus, lead=True)


def rank_execute(*, node_id: int, worker: str, plan) -> bool:
    """A rank's message (workers.orchestration.tasks.train_rank_task): join the gang unless this worker holds a rank of
    the attempt already (the message goes back for another worker) or the attempt is over; then run it.
    True when this rank trained to the end; a failure is on its row, and ends the attempt for all ranks.
    `plan(training_id)`: the training's (arguments, backend, GPUs), as its stage's runner makes them."""
    import socket

    from runs.pipeline.nodes.services import node_join

    joined = db_retry("rank", node_join, node_id=node_id, worker=worker, host=socket.getfqdn())
    if joined != "joined":
        logger.info("rank message %s: %s", node_id, "this worker holds a rank of that training already: given back"
                    if joined == "held" else "its attempt is over or another worker holds it")
        if joined == "held":
            time.sleep(1.0)  # let another worker take it first
        return False
    try:
        from runs.pipeline.nodes.models import TrainingNode

        training_id = TrainingNode.objects.values_list("training_id", flat=True).get(pk=node_id)
        arguments, backend, gpus = plan(training_id)
    except Exception as exc:
        db_retry("rank", node_mark, node_id=node_id, status=Status.FAILED, error=f"{type(exc).__name__}: {exc}")
        raise
    try:
        node_train(node_id=node_id, arguments=arguments, backend=backend, gpus=gpus)
    except Exception:  # noqa: BLE001 - on the rank's row; the stage's worker fails the stage
        logger.exception("rank message %s ended", node_id)
        return False
    return True
