"""One node's share of a training across nodes: torch's own elastic launcher, started by the worker that
holds the node's rank (runs.pipeline.nodes.services says who holds which), nothing of our own between ranks.

    python -m torch.distributed.run --nnodes N --node-rank R --nproc-per-node G --rdzv-backend c10d
        --rdzv-endpoint HOST:PORT --rdzv-id ID --rdzv-conf is_host=…,join_timeout=T --max-restarts 0 ...

(`torchrun` is that module's script.) Rank 0's torchrun hosts the c10d store at HOST:PORT, a port its
worker chose free and published; the others join it. With c10d the rendezvous, not --node-rank, orders
torch's global ranks, so the process that writes checkpoints and reports is the one on our rank 0's node
(EAGLE3WEB_TRAIN_NODE_RANK=0, local rank 0: workers.stages.train.processes.ddp.Ranks), whatever its global rank.
--max-restarts 0: a rank that dies ends this torchrun, and the attempt; the next attempt resumes from
the last saved state.

Our loop: each node runs one process (workers.stages.train.processes.in_rank) that reaches this worker over a
Unix socket and runs as workers.stages.train.processes.in_child's child does (callbacks, log records, result).

No process is left behind: torchrun runs under workers/stages/children/child_guard.py in a process group of its
own (the group goes when the worker dies, or when stop_group ends it); torchrun starts each rank in a
session of its own, so the rank dies with torchrun itself (PR_SET_PDEATHSIG in in_rank). `watch()`,
called about twice a second while the training runs, raises when the gang broke (another node failed,
its lease lapsed, the attempt was replaced): this node's torchrun is then stopped at once.
"""
from __future__ import annotations

import collections
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from workers.stages.children.child_process import die_with_parent, guarded, stop_group
from workers.stages.train.processes.in_child import CALLBACKS, REPO_ROOT, TrainingProcessDied, _serve

logger = logging.getLogger(__name__)

ACCEPT_POLL_SECONDS = 0.5
EXIT_WAIT_SECONDS = 60.0  # the training ended here; torchrun waits at its exit barrier for the other nodes
STOP_GRACE_SECONDS = 10.0  # SIGTERM, then SIGKILL: nothing of a broken gang is worth waiting for


@dataclass(frozen=True)
class NodePlace:
    """Where this node stands in the gang: what torchrun needs to find the others."""
    nodes: int
    rank: int
    endpoint: str  # host:port of rank 0's c10d store
    rdzv_id: str  # the same for every node of one attempt, new for each attempt
    join_timeout: int  # seconds torchrun waits for the others at the rendezvous


def free_port() -> int:
    """A TCP port free now on this host, for rank 0's c10d store (taken by torchrun a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def torchrun_args(place: NodePlace, *, nproc_per_node: int) -> list[str]:
    """torchrun's options for this node (the module and its arguments follow them)."""
    return ["--nnodes", str(place.nodes), "--node-rank", str(place.rank), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", place.endpoint, "--rdzv-id", place.rdzv_id,
            "--rdzv-conf", f"is_host={'true' if place.rank == 0 else 'false'},join_timeout={place.join_timeout}",
            "--max-restarts", "0"]


def node_env(place: NodePlace) -> dict[str, str]:
    return {**os.environ, "EAGLE3WEB_TRAIN_NODE_RANK": str(place.rank),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


class _Output:
    """torchrun's own lines (the rendezvous, a rank's exit): kept for the node's log and the error."""

    def __init__(self, proc: subprocess.Popen):
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.thread = threading.Thread(target=self._read, args=(proc,), name="torchrun-output", daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.strip():
                self.tail.append(line.rstrip())
                logger.info("torchrun: %s", line.rstrip())


def train_on_node(*, place: NodePlace, watch: Callable[[], None], **arguments):
    """Our loop's share on this node (see the module's note): the TrainResult on the writer's node,
    None on the others. Raises TrainingProcessDied when torchrun ended without a result, and whatever
    `watch` raised when the gang broke; the node's processes are gone either way."""
    callbacks = {name: arguments.pop(name) for name in CALLBACKS if arguments.get(name) is not None}
    for name in CALLBACKS:
        arguments.pop(name, None)
    levels = (logging.getLogger().getEffectiveLevel(), logging.getLogger("workers").getEffectiveLevel())
    settings = {"torch_threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
                "log_level": min(levels)}
    folder = tempfile.mkdtemp(prefix="eagle3web-rank-")  # 0700: only this user reaches the socket
    address = os.path.join(folder, "worker.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)
    listener.settimeout(ACCEPT_POLL_SECONDS)
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_args(place, nproc_per_node=1),
               "-m", "workers.stages.train.processes.in_rank", address]
    logger.info("rank %d of %d: %s", place.rank, place.nodes, " ".join(command[1:]))
    proc = subprocess.Popen(guarded(command), cwd=REPO_ROOT, env=node_env(place), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True, preexec_fn=die_with_parent())
    output = _Output(proc)
    conn = None
    try:
        while conn is None:
            try:
                sock, _ = listener.accept()
                conn = Connection(sock.detach())
            except TimeoutError:
                if proc.poll() is not None:
                    output.thread.join(timeout=5)
                    raise _ended(proc, output) from None
                watch()
        conn.send((arguments, sorted(callbacks), settings))
        try:
            return _serve(conn, proc, callbacks, watch)
        except TrainingProcessDied:
            output.thread.join(timeout=5)
            raise _ended(proc, output) from None
    finally:
        if conn is not None:
            conn.close()
        listener.close()
        if proc.poll() is None and conn is not None:  # torchrun's exit barrier: the other nodes end too
            try:
                proc.wait(timeout=EXIT_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("this node's torchrun did not end within %.0f s of its training; stopping it",
                               EXIT_WAIT_SECONDS)
        if proc.poll() is None:
            stop_group(proc, STOP_GRACE_SECONDS)
        shutil.rmtree(folder, ignore_errors=True)


def _ended(proc: subprocess.Popen, output: _Output) -> TrainingProcessDied:
    last = "\n".join(list(output.tail)[-8:])
    return TrainingProcessDied(f"this node's torchrun (pid {proc.pid}) exited with code {proc.returncode} before the "
                               f"training finished; a retry resumes from its last saved state. torchrun's last "
                               f"lines:\n{last}")


def rendezvous_host() -> str:
    """The name other nodes reach this host by: EAGLE3WEB_TRAIN_RENDEZVOUS_HOST when set (a host with
    several networks), else its fully qualified name."""
    return os.environ.get("EAGLE3WEB_TRAIN_RENDEZVOUS_HOST") or socket.getfqdn()

