"""A fresh worker process's first stage imports torch while the system sampler reads the GPUs in its own
thread (workers.orchestration.system_metrics): the sampler must wait for a torch imported in full, not log
"partially initialized module 'torch' has no attribute 'cuda'". Run in a fresh interpreter, where torch is
not imported yet, as in a new worker process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.worker import BASE_DIR

# The sampler reads as fast as it can while the main thread imports torch; it counts the reads it made while
# torch sat half-imported in sys.modules (the window the bug needs), so that the test shows it was exercised.
SCRIPT = r"""
import json, logging, sys, threading
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from workers.orchestration.system_metrics import SystemMeter

meter = SystemMeter()
done = threading.Event()
window = {"reads": 0}

def sample():
    while not done.is_set():
        module = sys.modules.get("torch")
        if module is not None and getattr(module.__spec__, "_initializing", False):
            window["reads"] += 1
        meter.sample()

thread = threading.Thread(target=sample)
thread.start()
import torch
torch.set_num_threads(1)
done.set()
thread.join()
meter.sample()
print(json.dumps(window))
"""


def test_sampling_while_torch_imports_logs_no_partially_initialized_module():
    env = {**os.environ, "EAGLE3WEB_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", "DJANGO_SETTINGS_MODULE": "eagle3web.settings"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["reads"] > 0  # read while torch was half-imported
    assert "partially initialized module" not in done.stderr
    assert "could not read the GPUs' figures" not in done.stderr, done.stderr[-3000:]
