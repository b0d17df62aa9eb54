"""TEST ENTRY for torchrun: the dashboard's own metric record writer (workers.stages.train.with_speculators.entry,
every speculators.metrics record as logged, to EAGLE3WEB_METRICS_PATH) as the known answer, then the docs'
example script client/examples/speculators_train.py as a user runs it, with speculators' flags in argv."""
import os
import runpy
import sys
from pathlib import Path

from workers.stages.train.with_speculators.entry import install

if os.environ.get("RANK", "0") == "0":
    install(os.environ["EAGLE3WEB_METRICS_PATH"])
example = Path(__file__).resolve().parents[2] / "client" / "examples" / "speculators_train.py"
sys.argv[0] = str(example)
runpy.run_path(str(example), run_name="__main__")
