"""What every long-running child of a stage (vLLM's server, torchrun and its ranks) needs in common."""
from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _sigterm_when_parent_dies() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent():
    """A `preexec_fn` for Popen: the child gets SIGTERM when the worker that started it dies. Children
    run in their own process group (so that a stop reaches all their processes), which also keeps them
    out of signals meant for the worker: without this a SIGKILLed worker would leave them holding the
    GPUs that the retried attempt needs. None (nothing to do) off Linux."""
    return _sigterm_when_parent_dies if sys.platform == "linux" else None
