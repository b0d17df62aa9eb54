"""What every long-running child of a stage (vLLM's server, torchrun and its ranks) needs in common."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _sigterm_when_parent_dies() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent():
    """A `preexec_fn` for Popen: the child gets SIGTERM when the worker that started it dies. Children
    run in their own process group (so that a stop reaches all their processes), which also keeps them
    out of signals meant for the worker: without this a SIGKILLed worker would leave them holding the
    GPUs that the retried attempt needs. None (nothing to do) off Linux."""
    return _sigterm_when_parent_dies if sys.platform == "linux" else None


GUARD = str(Path(__file__).with_name("child_guard.py"))


def guarded(command: list[str]) -> list[str]:
    """`command` run under workers/stages/children/child_guard.py, the process group's leader that takes the whole
    group down (vLLM's engine cores, torchrun's ranks) when the worker dies; PR_SET_PDEATHSIG alone
    reaches only the process the worker started."""
    return [sys.executable, GUARD, str(os.getpid()), "--", *command]


def _signal_group(pgid: int, sig: int) -> bool:
    """False when no process of the group is left to receive it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the group id was reused by someone else's process: ours is gone
        return False
    return True


def stop_group(proc: subprocess.Popen, grace_s: float) -> bool:
    """SIGTERM to the process group `proc` leads (started with start_new_session), SIGKILL to what
    is left of it after grace_s; waits for the leader. True when the grace ran out and SIGKILL went."""
    pgid = proc.pid
    if not _signal_group(pgid, signal.SIGTERM):
        proc.wait()
        return False
    deadline = time.monotonic() + grace_s
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # The leader may be gone while its workers (engine cores, ranks) still shut down.
    while time.monotonic() < deadline and _signal_group(pgid, 0):
        time.sleep(0.2)
    killed = _signal_group(pgid, signal.SIGKILL)
    proc.wait()
    return killed
