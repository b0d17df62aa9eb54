"""A training of workers.stages.train.loop in a process of its own, started for it and gone when it ends.

A Celery pool process lives for weeks and runs training after training. What torch keeps per process
would outlive each of them there: dynamo's compiled graphs (flex attention compiles one per padded
length, TTT step and grad mode, and packed_attention makes the recompile limit an error, so about
ten trainings of other shapes ended in FailOnRecompileLimitHit), its raised limits, the CUDA
caching allocator's blocks and the CUDA context. Here the worker starts `python -m
workers.stages.train.processes.in_child` per training (as speculators' trainer runs under torchrun), so the
twenty-first training of a worker starts from the same empty process as its first, and the GPU's
memory goes back whole when the training's process exits.

The worker keeps its callbacks: the child calls each one (progress, metrics, should_stop,
checkpoints, the split, resume) over a socket and waits for the worker's answer, so they run in the
worker in the order and at the moment they would have run in-process (a metric is recorded before
the resume state that follows it is saved; a cancel stops the next step). A callback that raises
(StageCancelled from on_progress) ends the child, and the worker raises that same exception. The
child's log records reach the worker's loggers (the stage's log tail). The child's own error comes
back as the same exception with the child's traceback as a note; a child that dies without an answer
(killed, out of memory, a crash) raises TrainingProcessDied, naming how it ended. The worker's
heartbeat thread renews the stage's lease meanwhile. A child dies with the worker (PR_SET_PDEATHSIG,
workers.stages.children.child_process), and the worker stops the child's process group if it leaves early.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

from workers.stages.children.child_process import die_with_parent, stop_group

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[4]
CALLBACKS = ("on_progress", "on_metrics", "should_stop", "on_checkpoint", "on_split", "on_resume", "stop_early")
POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 30.0  # an abandoned child's SIGTERM, then SIGKILL: a capture server may be stopping


class TrainingProcessDied(RuntimeError):
    """The training's process ended without handing back a result or an error."""


class _WorkerCallbackRaised(Exception):
    """In the child: the worker's callback raised; the worker raises its own exception."""


def train_in_child(**arguments):
    """workers.stages.train.loop.train(**arguments) run in a fresh process; its TrainResult."""
    callbacks = {name: arguments.pop(name) for name in CALLBACKS if name in arguments}
    callbacks = {name: fn for name, fn in callbacks.items() if fn is not None}
    levels = (logging.getLogger().getEffectiveLevel(), logging.getLogger("workers").getEffectiveLevel())
    settings = {"torch_threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
                "log_level": min(levels)}
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    with theirs:
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent())
    conn = Connection(ours.detach())
    try:
        conn.send((arguments, sorted(callbacks), settings))
        return _serve(conn, proc, callbacks)
    finally:
        conn.close()
        if proc.poll() is None:  # the worker left early (its own error, a time limit): the child goes too
            stop_group(proc, STOP_GRACE_SECONDS)


def _serve(conn: Connection, proc: subprocess.Popen, callbacks: dict, watch=None):
    """Answers the child's calls until it hands back its result; `watch()`, called while it is quiet,
    raises to end it (a training across nodes whose gang broke: workers.stages.train.processes.nodes)."""
    raised: BaseException | None = None
    while True:
        if not conn.poll(POLL_SECONDS):
            if proc.poll() is not None and not conn.poll(0):
                raise raised or _died(proc)
            if watch is not None:
                watch()
            continue
        try:
            message = conn.recv()
        except (EOFError, OSError):
            proc.wait()
            raise (raised or _died(proc)) from None
        kind = message[0]
        if kind == "call":
            try:
                value = callbacks[message[1]](*message[2])
                # The loop reads should_stop's and stop_early's answers alone; the others may return the
                # worker's own objects (a checkpoint's rows), which the child could not rebuild.
                answer = ("ok", bool(value) if message[1] == "should_stop"
                          else str(value or "") if message[1] == "stop_early" else None)
            except BaseException as exc:  # noqa: BLE001 - raised here once the child has ended
                raised, answer = exc, ("raised", f"{type(exc).__name__}: {exc}")
            try:
                conn.send(answer)
            except OSError:  # the child is gone
                proc.wait()
                raise (raised or _died(proc)) from None
        elif kind == "log":
            record = logging.makeLogRecord(message[1])
            target = logging.getLogger(record.name)
            if target.isEnabledFor(record.levelno):
                target.handle(record)
        elif kind == "done":
            if watch is None:  # a node's torchrun may wait at its exit barrier: its caller waits for it
                proc.wait()
            return message[1]
        elif kind == "failed":
            proc.wait()
            if raised is not None:
                raise raised
            raise _child_error(*message[1:])


def _died(proc: subprocess.Popen) -> TrainingProcessDied:
    code = proc.returncode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        how = f"was killed by {name}" + (" (as the kernel's out-of-memory killer does)" if name == "SIGKILL" else "")
    else:
        how = f"exited with code {code}"
    return TrainingProcessDied(f"the training's process (pid {proc.pid}) {how} before it finished; its log "
                               "lines above say how far it got, and a retry resumes from its last saved state")


def _child_error(pickled: bytes | None, type_name: str, text: str, trace: str) -> BaseException:
    exc = None
    if pickled is not None:
        try:
            exc = pickle.loads(pickled)
        except Exception:  # noqa: BLE001 - a class the worker cannot rebuild: said by name below
            exc = None
    if not isinstance(exc, BaseException) or str(exc) != text:
        exc = RuntimeError(f"the training failed: {type_name}: {text}")
    exc.add_note(f"in the training's process:\n{trace}")
    return exc


class _Channel:
    """The child's end: calls wait for the worker's answer; one at a time across threads."""

    def __init__(self, conn: Connection):
        self.conn, self.lock = conn, threading.Lock()

    def send(self, message) -> None:
        with self.lock:
            self.conn.send(message)

    def caller(self, name: str):
        def call(*args):
            with self.lock:
                self.conn.send(("call", name, args))
                answer, value = self.conn.recv()
            if answer == "raised":
                raise _WorkerCallbackRaised(value)
            return value
        return call


class _ToWorker(logging.Handler):
    def __init__(self, channel: _Channel):
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else None
            fields = dict(record.__dict__, msg=record.getMessage(), args=None, exc_info=None, exc_text=trace)
            self.channel.send(("log", {k: v for k, v in fields.items() if _plain(v)}))
        except Exception:  # noqa: BLE001 - logging never breaks the training
            self.handleError(record)


def _plain(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def main(fd: int) -> int:
    return serve_training(Connection(fd))


def serve_training(conn: Connection, ranks=None) -> int:
    """The child's side: the arguments come over `conn`, the callbacks go back over it. `ranks`: one
    process of a training across nodes (workers.stages.train.processes.in_rank)."""
    channel = _Channel(conn)
    arguments, callback_names, settings = channel.conn.recv()
    root = logging.getLogger()
    root.handlers[:] = [_ToWorker(channel)]
    root.setLevel(settings["log_level"])
    try:
        import torch

        if settings["torch_threads"]:
            torch.set_num_threads(settings["torch_threads"])
        from workers.stages.train.loop import train

        if ranks is not None:
            arguments["ranks"] = ranks
        result = train(**arguments, **{name: channel.caller(name) for name in callback_names})
    except BaseException as exc:  # noqa: BLE001 - every ending is told to the worker
        try:
            pickled = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - said by name and message instead
            pickled = None
        channel.send(("failed", pickled, type(exc).__name__, str(exc), traceback.format_exc()))
        return 1
    channel.send(("done", result))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
