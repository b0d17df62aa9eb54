"""bench/load/load_report.py's CPU accounting: the load benchmark says how many cores each side used, and
"others" is what is left for work outside the benchmark. The train stage runs its trainer in a session of its
own, so a match on the worker's process group alone put the training in "others" (trainer 0.01 cores, others
1.06, while it trained)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from bench.load.load_report import cpu_use

# Told to go on the stdin it shares with its leader, it burns one CPU second, says so and waits to be killed.
BURN = ("import sys, time\nsys.stdin.readline()\nstart = time.process_time()\n"
        "while time.process_time() - start < 1.0: pass\nprint('done', flush=True)\ntime.sleep(120)\n")
# The leader starts the burner in a session (and process group) of its own, as the train stage starts its trainer.
LEADER = ("import subprocess, sys\n"
          f"child = subprocess.Popen([sys.executable, '-c', {BURN!r}], start_new_session=True)\n"
          "print(child.pid, flush=True)\nchild.wait()\n")


def test_a_grandchild_in_a_session_of_its_own_counts_in_its_ancestors_group():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], start_new_session=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    burner = int(leader.stdout.readline())
    try:
        assert os.getpgid(burner) == burner != os.getpgid(leader.pid) == leader.pid
        before = cpu_use({"leader": leader.pid}, database="no-such-database")
        leader.stdin.write("go\n")
        leader.stdin.flush()
        assert leader.stdout.readline().strip() == "done"
        after = cpu_use({"leader": leader.pid}, database="no-such-database")
    finally:
        for group in (burner, leader.pid):
            os.killpg(group, signal.SIGKILL)
        leader.wait(timeout=30)
    burned = after["leader"] - before["leader"]
    assert 0.98 <= burned <= 1.5, burned  # its second (to the clock tick), and its print
    assert after["machine"] - before["machine"] >= burned - 0.05
