"""A stage's long-running children (torchrun with speculators' trainer, vLLM's server) die with the
worker that started them: a SIGKILLed pool process must not leave them holding the GPUs that the
retried attempt needs."""
import os
import signal
import sys
import time

import pytest

from workers.stages.train.with_speculators.trainer import _Trainer
from workers.stages.extract.vllm_server import VllmServer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's (prctl)")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _child_outlives_a_killed_worker(start, tmp_path) -> bool:
    """Fork a stand-in for the Celery pool process, let it start the child, SIGKILL it; True if the
    child is still there two seconds later (it is then killed)."""
    pid_file = tmp_path / "child.pid"
    worker = os.fork()
    if worker == 0:
        try:
            pid_file.write_text(str(start()))
            time.sleep(60)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)
    deadline = time.monotonic() + 2
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        return True
    return False


def test_torchrun_dies_with_its_worker(tmp_path):
    def start():
        return _Trainer(SLEEPER, cwd=tmp_path, env=dict(os.environ), log_path=tmp_path / "train.log").proc.pid

    assert not _child_outlives_a_killed_worker(start, tmp_path)


def test_the_vllm_server_dies_with_its_worker(tmp_path):
    def start():
        server = VllmServer(command=SLEEPER, log_path=tmp_path / "vllm.log", port=1)
        server.start()
        return server.proc.pid

    assert not _child_outlives_a_killed_worker(start, tmp_path)
