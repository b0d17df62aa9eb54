"""The leader of a stage's child process group (vLLM's server, torchrun): runs the command as its own
child and takes the whole group down with it when the worker that started it dies.

    python child_guard.py WORKER_PID -- COMMAND [ARGS...]

A process started with PR_SET_PDEATHSIG gets its signal when its parent dies, but its own children do
not: a SIGKILLed worker left vLLM's API server shutting down slowly and `VLLM::EngineCore`, re-parented
to PID 1, holding the GPU for up to a minute (a probe saw it). This guard is the process the worker
starts (workers.stages.children.child_process.guarded). On the worker's death signal it sends SIGTERM to its
whole process group; on any SIGTERM it waits for the group to end. When the worker asked (a cancel:
speculators saves its state meanwhile) the worker's own stop_group sends SIGKILL after its grace; when
the worker is gone (its death signal, or a parent that changed) the guard sends SIGKILL to the group
after ORPHAN_GRACE_SECONDS. It exits with the command's code (128 + the signal when a signal ended it)
and passes its output through untouched. Standard library only: it runs under whatever Python
started the worker, beside a command from another environment.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ORPHAN_GRACE_SECONDS = 3.0
POLL_SECONDS = 0.2
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _unblock_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _group_alive(pgid: int, me: int) -> bool:
    """Whether any process but this one is left in the group, zombies not counted (Linux: /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after its last ")"
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: child_guard.py WORKER_PID -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    # The worker's pid comes from the worker: read here, a parent that died while this Python started
    # would already be init, and its death would go unnoticed.
    parent, command = int(argv[0]), argv[2:]
    me, pgid = os.getpid(), os.getpgid(0)
    child = None
    stopping = []

    def stop_group(*_args) -> None:
        if stopping:
            return
        stopping.append(True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the SIGTERM below reaches this process too
        if os.getppid() != parent:  # the worker's death signal came to this process alone: pass it on
            os.killpg(pgid, signal.SIGTERM)
        # Else the worker's stop_group signalled the whole group itself (a second SIGTERM could cut
        # torchrun's own shutdown short), and decides when SIGKILL comes.
        deadline = None
        while (child is not None and child.poll() is None) or _group_alive(pgid, me):  # poll reaps ours
            if deadline is None and os.getppid() != parent:
                deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
            if deadline is not None and time.monotonic() >= deadline:
                os.killpg(pgid, signal.SIGKILL)  # this process too: nothing is left to wait for
            time.sleep(POLL_SECONDS)

    signal.signal(signal.SIGTERM, stop_group)
    signal.signal(signal.SIGINT, stop_group)
    # A stop that came between here and `child` naming the command would find nothing to stop, and the
    # command would start after it and run for good (vllm serve outlived a SIGKILLed worker in CI):
    # the stop signals wait, blocked, until the command runs, and are handled then.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    if os.getppid() != parent:  # the worker died while this process started
        stop_group()
        return 128 + signal.SIGTERM
    # same group; stdin, stdout and stderr inherited; the command itself starts with nothing blocked
    child = subprocess.Popen(command, preexec_fn=_unblock_stop_signals)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    while True:
        try:
            code = child.wait(timeout=POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:  # the worker died and its death signal did not come (or came early)
                stop_group()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
