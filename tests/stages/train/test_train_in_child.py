"""Each training runs in a process of its own (workers.stages.train.processes.in_child), the way the Celery task
runs it (workers.orchestration.stage_runners._train): this test process stands in for the long-lived pool process.

What a worker sees through the process boundary is checked here: twenty trainings of other shapes
leave the twenty-first training as a fresh process trains it; progress, metrics, the split, resume and
checkpoints reach the worker's callbacks in order; a cancel stops the child and a retry resumes from
its saved state; the worker's own exception, the child's error and a killed child each come back
saying what happened; the child's log lines reach the worker's loggers.

On this CPU nothing is compiled (flex attention has no backward on the CPU, so the CPU trains through
the per-document twin): the twenty trainings here show that a worker's trainings do not depend on
one another through the worker, not the recompile limit that twenty GPU trainings in one process hit.
"""
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from workers.stages.train.processes.in_child import TrainingProcessDied, train_in_child
from workers.stages.train.results import TrainingStopped
from workers.stages.train.data import TrainInputError

DRAFT_VOCAB = 256
REPO = Path(__file__).resolve().parents[3]


# The child takes the worker's torch thread count, as a pool process set it (tests/stages/conftest.py).
pytestmark = [pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def inputs(training_inputs):
    return training_inputs(num_rows=16, draft_vocab_size=DRAFT_VOCAB)


def _arguments(inputs, out_dir: Path, **shape) -> dict:
    return dict(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                hidden_states_dir=inputs.hidden_states_dir, d2t_path=inputs.d2t_path, t2d_path=inputs.t2d_path,
                out_dir=out_dir, layer_ids=inputs.layer_ids, lr=3e-3, draft_vocab_size=DRAFT_VOCAB,
                **{"epochs": 1, "ttt_steps": 3, "max_tokens_per_step": 512, **shape})


def _train_losses(points: list[dict]) -> list[float]:
    return [p["value"] for p in points if p["split"] == "train" and p["key"] == "loss"]


FRESH_PROCESS = """
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from workers.stages.train.loop import train
args = json.loads(sys.argv[1])
points = []
train(**{k: Path(v) if k.endswith(("_dir", "_path")) else v for k, v in args.items()}, on_metrics=points.extend)
print(json.dumps([p["value"] for p in points if p["split"] == "train" and p["key"] == "loss"]))
"""


@pytest.mark.slow
def test_a_worker_trains_its_21st_training_of_new_shapes_as_a_fresh_process_does(inputs, tmp_path):
    for i in range(20):  # each of another shape: TTT steps, and tokens per step
        result = train_in_child(**_arguments(inputs, tmp_path / f"earlier-{i}", ttt_steps=1 + i % 3,
                                             max_tokens_per_step=256 + 48 * i))
        assert result.steps > 0 and result.checkpoints, i
    points: list[dict] = []
    last = _arguments(inputs, tmp_path / "21st", ttt_steps=2, max_tokens_per_step=384)
    result = train_in_child(**last, on_metrics=points.extend)
    worker_losses = _train_losses(points)
    assert len(worker_losses) == result.steps > 1

    fresh = dict(last, out_dir=tmp_path / "fresh")
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, json.dumps({k: str(v) if isinstance(v, Path) else v
                                                                              for k, v in fresh.items()})],
                         cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    fresh_losses = json.loads(out.stdout.strip().splitlines()[-1])
    assert worker_losses == pytest.approx(fresh_losses, rel=1e-6, abs=1e-7)


def test_the_workers_callbacks_hear_the_training_in_order_and_its_log_lines(inputs, tmp_path):
    heard: list[tuple] = []
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(f"{record.name}: {record.getMessage()}")

    handler = Collect(level=logging.INFO)
    workers_logger = logging.getLogger("workers")
    workers_logger.addHandler(handler)
    level = workers_logger.level
    workers_logger.setLevel(logging.INFO)
    try:
        result = train_in_child(
            **_arguments(inputs, tmp_path / "out", max_tokens_per_step=2, epochs=2),
            on_resume=lambda step, epochs_done: heard.append(("resume", step, epochs_done)),
            on_split=lambda split: heard.append(("split", split["train_rows"])),
            on_progress=lambda done, total: heard.append(("progress", done, total)),
            on_metrics=lambda points: heard.append(("metrics", len(points))),
            # what the worker's callback returns stays in the worker (the runner's returns database rows)
            on_checkpoint=lambda c: heard.append(("checkpoint", c.epoch, Path(c.path).is_dir())) or (lambda: None),
            should_stop=lambda: heard.append(("should_stop",)) and False)
    finally:
        workers_logger.removeHandler(handler)
        workers_logger.setLevel(level)
    kinds = [h[0] for h in heard]
    assert heard[0] == ("resume", 0, 0) and heard[1][0] == "split" and heard[1][1] > 0
    progress = [h for h in heard if h[0] == "progress"]
    assert progress[0] == ("progress", 0, result.steps) and progress[-1] == ("progress", result.steps, result.steps)
    assert [d for _p, d, _t in progress] == list(range(result.steps + 1))
    assert kinds.count("should_stop") >= result.steps
    assert [h for h in heard if h[0] == "checkpoint"] == [("checkpoint", 0, True), ("checkpoint", 1, True)]
    assert sum(h[1] for h in heard if h[0] == "metrics") > result.steps  # train and validation points
    assert any(line.startswith("workers.stages.train.loop: training on cpu") for line in lines), lines
    assert any(line.startswith("workers.stages.train.loop: epoch 1: train loss") for line in lines), lines


def test_a_cancel_stops_the_training_and_a_retry_resumes_where_it_saved(inputs, tmp_path):
    arguments = _arguments(inputs, tmp_path / "out", max_tokens_per_step=2, resume_every_steps=1)
    progress: list[int] = []
    with pytest.raises(TrainingStopped) as stopped:
        train_in_child(**arguments, on_progress=lambda done, total: progress.append(done),
                       should_stop=lambda: len(progress) > 3)
    assert stopped.value.steps_done == 3 and str(stopped.value) == "training stopped on request after 3 steps"
    # The state of step 3 was not saved: the cancel came as it was about to be (the loop asks first).
    resumed: list[tuple] = []
    result = train_in_child(**arguments, on_resume=lambda step, epochs: resumed.append((step, epochs)))
    assert resumed == [(2, 0)] and result.resumed_from_step == 2 and result.steps > 3


class Refused(Exception):
    """The worker's own error, raised by one of its callbacks (as StageCancelled from on_progress)."""


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids.update(int(pid) for pid in (task / "children").read_text().split())
    return pids


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_worker_callbacks_exception_ends_the_child_and_is_raised_as_itself(inputs, tmp_path):
    before = _children()

    def refuse(_checkpoint):
        raise Refused("the run was deleted")

    with pytest.raises(Refused, match="the run was deleted"):
        train_in_child(**_arguments(inputs, tmp_path / "out"), on_checkpoint=refuse)
    assert _children() == before  # the child has ended (and was reaped)


def test_a_training_error_comes_back_as_its_own_type_with_the_childs_traceback(inputs, tmp_path):
    bad = tmp_path / "d2t.npy"
    import numpy as np

    np.save(bad, np.zeros(DRAFT_VOCAB + 1, dtype=np.int64))
    with pytest.raises(TrainInputError, match=f"{bad}: {DRAFT_VOCAB + 1} entries") as failed:
        train_in_child(**dict(_arguments(inputs, tmp_path / "out"), d2t_path=bad))
    assert "in the training's process" in failed.value.__notes__[0]
    assert "build_draft_model" in failed.value.__notes__[0]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_killed_training_process_is_said_to_be_killed(inputs, tmp_path):
    before = _children()

    def kill_child(done, _total):
        if done == 1:
            for pid in _children() - before:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(TrainingProcessDied, match="was killed by SIGKILL"):
        train_in_child(**_arguments(inputs, tmp_path / "out", max_tokens_per_step=2), on_progress=kill_child)
