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
    child is still there five seconds later (it is then killed)."""
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
    deadline = time.monotonic() + 5  # the guard's SIGTERM, then SIGKILL 3 s later for what ignores it
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


# The command starts a grandchild that ignores SIGTERM, as vLLM's engine core outlived its server's
# shutdown for up to a minute after a probe SIGKILLed the worker.
TREE = [sys.executable, "-c", (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']); time.sleep(120)")]


def _group_outlives_a_killed_worker(start, tmp_path, within_s: float = 10.0) -> bool:
    """As above, for the child's whole process group: True if any of it is left `within_s` after the
    worker's SIGKILL (what is left is then killed)."""
    from workers.stages.children.child_guard import _group_alive

    pgid_file = tmp_path / "group.pid"
    worker = os.fork()
    if worker == 0:
        try:
            pgid = start()
            time.sleep(1.0)  # the grandchild is started
            pgid_file.write_text(str(pgid))
            time.sleep(60)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not pgid_file.exists() or not pgid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.1)
    pgid = int(pgid_file.read_text())
    assert _group_alive(pgid, -1)
    os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)
    deadline = time.monotonic() + within_s
    while _group_alive(pgid, -1) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pgid, -1):
        os.killpg(pgid, signal.SIGKILL)
        return True
    return False


def test_a_vllm_servers_whole_process_group_dies_with_its_worker(tmp_path):
    def start():
        server = VllmServer(command=TREE, log_path=tmp_path / "vllm.log", port=1)
        server.start()
        return server.proc.pid

    assert not _group_outlives_a_killed_worker(start, tmp_path)


def test_torchruns_whole_process_group_dies_with_its_worker(tmp_path):
    def start():
        return _Trainer(TREE, cwd=tmp_path, env=dict(os.environ), log_path=tmp_path / "train.log").proc.pid

    assert not _group_outlives_a_killed_worker(start, tmp_path)


def test_without_the_guard_the_grandchild_outlives_the_worker(tmp_path):
    """What the guard is for: the parent-death signal alone reaches the child, not the grandchild."""
    import subprocess

    from workers.stages.children.child_process import die_with_parent

    def start():
        return subprocess.Popen(TREE, start_new_session=True, preexec_fn=die_with_parent()).pid

    assert _group_outlives_a_killed_worker(start, tmp_path, within_s=5.0)


def test_the_guard_passes_the_exit_code_and_a_requested_stop_through(tmp_path):
    import subprocess

    from workers.stages.children.child_process import guarded, stop_group

    done = subprocess.run(guarded([sys.executable, "-c", "import sys; print('out'); sys.exit(7)"]),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (7, "out\n")
    proc = subprocess.Popen(guarded(TREE), start_new_session=True)
    time.sleep(1.0)
    killed = stop_group(proc, grace_s=3.0)  # the grandchild ignores SIGTERM: SIGKILL after the grace
    assert killed and proc.returncode is not None
    from workers.stages.children.child_guard import _group_alive
    # SIGKILL is delivered at once but a loaded host takes a moment to tear the processes down (CI once
    # saw the grandchild still listed right after): gone within 5 s, not at the very instant.
    deadline = time.monotonic() + 5.0
    while _group_alive(proc.pid, -1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_alive(proc.pid, -1)


def test_a_missing_vllm_executable_is_named_before_anything_starts(tmp_path):
    from workers.stages.extract.vllm_server import VllmServerError

    server = VllmServer(command=["/nonexistent/vllm", "serve"], log_path=tmp_path / "vllm.log", port=1)
    with pytest.raises(VllmServerError, match="'/nonexistent/vllm' was not found"):
        server.start()
    assert server.proc is None


def test_a_worker_that_dies_while_the_guard_starts_still_takes_the_command_down(tmp_path):
    """The guard is told the worker's pid: one that is gone before the guard runs is noticed."""
    import subprocess

    from workers.stages.children.child_process import GUARD

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    marker = tmp_path / "started"
    # A "worker" pid that is not the guard's parent (this process is): the command must not start.
    done = subprocess.run([sys.executable, GUARD, str(dead.pid), "--", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w')"], start_new_session=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM and not marker.exists()


SLOW_FORK = '''\
import os, subprocess, sys, time
_init = subprocess.Popen.__init__
def _slow_start(self, *args, **kwargs):
    marker = os.environ.get("GUARD_STARTING_MARKER")
    if marker and os.path.basename(sys.argv[0] or "") == "child_guard.py":
        open(marker, "w").close()
        time.sleep(1.0)  # a loaded host: the guard's handler is in place and its command not yet started
    _init(self, *args, **kwargs)
subprocess.Popen.__init__ = _slow_start
'''


def test_a_worker_killed_while_the_guard_starts_its_command_leaves_nothing_behind(tmp_path):
    """The worker's death signal can come after the guard's handler is in place and before the command
    runs. CI once left vllm serve running for good that way: the handler found nothing to stop, then
    the guard started the command anyway. A sitecustomize slows the guard's start of its command by
    1 s; the worker is SIGKILLed in that second."""
    import subprocess

    from workers.stages.children.child_guard import _group_alive

    (tmp_path / "sitecustomize.py").write_text(SLOW_FORK)
    marker = tmp_path / "starting"
    starter = ("import subprocess, sys, time; from workers.stages.children.child_process import die_with_parent, guarded; "
               "guard = subprocess.Popen(guarded(sys.argv[1:]), start_new_session=True, preexec_fn=die_with_parent()); "
               "print(guard.pid, flush=True); time.sleep(120)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GUARD_STARTING_MARKER": str(marker)}
    worker = subprocess.Popen([sys.executable, "-c", starter, *TREE], env=env, stdout=subprocess.PIPE, text=True)
    guard = int(worker.stdout.readline())
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline, "the guard never came to start its command"
        time.sleep(0.02)
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 10  # the command starts, then SIGTERM and SIGKILL 3 s later
    while _group_alive(guard, -1) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _group_alive(guard, -1)
    if left:
        os.killpg(guard, signal.SIGKILL)
    assert not left, "the command outlived its worker"
