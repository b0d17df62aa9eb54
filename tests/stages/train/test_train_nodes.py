"""Our loop across two nodes (workers.stages.train.processes.nodes): two torchruns on this machine, gloo on the CPU,
started from two threads of this process as two workers would start them, against one process over the
same global batches.

Tolerance: each step's gradient is the same sum taken in another order (two halves all-reduced by gloo
instead of one packed batch), and the step losses are the global token means rebuilt from each rank's
share (workers.stages.train.processes.ddp); float32 sums in another order differ in their last bits, which AdamW's
steps carry into the next steps' losses. 1e-4 relative over the first steps is far inside what a wrong
split gives (a rank's mean weighted 1/2 instead of by its tokens, or a missed all-reduce: 1e-2 and more).
"""
import threading

import pytest

from workers.stages.train.processes.nodes import NodePlace, free_port, train_on_node
from workers.stages.train.loop import train

DRAFT_VOCAB = 256
TOLERANCE = 1e-4


pytestmark = [pytest.mark.usefixtures("one_torch_thread")]  # tests/stages/conftest.py


@pytest.fixture(scope="module")
def inputs(training_inputs):
    return training_inputs(num_rows=24, draft_vocab_size=DRAFT_VOCAB)


def _arguments(inputs, out_dir, **shape) -> dict:
    return dict(target_dir=inputs.target_dir, prepared_dir=inputs.prepared_dir,
                hidden_states_dir=inputs.hidden_states_dir, d2t_path=inputs.d2t_path, t2d_path=inputs.t2d_path,
                out_dir=out_dir, layer_ids=inputs.layer_ids, lr=3e-3, draft_vocab_size=DRAFT_VOCAB,
                **{"epochs": 1, "ttt_steps": 2, "max_tokens_per_step": 256, **shape})


def _losses(points):
    return [p["value"] for p in points if p["split"] == "train" and p["key"] == "loss"]


def _two_nodes(arguments: dict, *, rdzv_id: str, callbacks: dict, watch=lambda: None, join_timeout=30):
    endpoint = f"127.0.0.1:{free_port()}"
    outcomes: dict[int, object] = {}

    def node(rank: int) -> None:
        place = NodePlace(nodes=2, rank=rank, endpoint=endpoint, rdzv_id=rdzv_id, join_timeout=join_timeout)
        try:
            outcomes[rank] = train_on_node(place=place, watch=watch, **arguments, **(callbacks if rank == 0 else {}))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcomes[rank] = exc

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return outcomes


def test_two_nodes_train_the_losses_of_one_process_over_the_same_global_batch(inputs, tmp_path):
    alone: list[dict] = []
    one = train(**_arguments(inputs, tmp_path / "one"), on_metrics=alone.extend)
    points: list[dict] = []
    progress: list[tuple[int, int]] = []
    outcomes = _two_nodes(_arguments(inputs, tmp_path / "two"), rdzv_id="equal",
                          callbacks={"on_metrics": points.extend, "on_progress": lambda d, t: progress.append((d, t))})
    result = outcomes[0]
    assert not isinstance(result, BaseException), result
    assert outcomes[1] is None  # the other node writes nothing and hands nothing back
    expected, got = _losses(alone), _losses(points)
    assert len(expected) == one.steps >= 4 and len(got) == len(expected), (expected, got)
    assert got == pytest.approx(expected, rel=TOLERANCE), (expected, got)
    assert result.train_tokens == one.train_tokens and result.loss_tokens_trained == one.loss_tokens_trained
    assert progress[-1] == (one.steps, one.steps)
    assert [c.epoch for c in result.checkpoints] == [0]
    assert (tmp_path / "two" / "checkpoint_0").exists() or any((tmp_path / "two").iterdir())


# In each rank's process (torchrun sets RANK; its own launcher has none): every call of speculators' checkpoint
# writes, logged with torch's rank before speculators' own rank-0 rule is asked.
SAVES_SEAM = '''
import os
if "RANK" in os.environ:
    from speculators.train.checkpointer import SingleGPUCheckpointer

    def _logged(name):
        original = getattr(SingleGPUCheckpointer, name)

        def logging_call(self, *args, **kwargs):
            with open({log!r}, "a") as log:
                log.write(name + ":" + os.environ["RANK"] + "\\n")
            return original(self, *args, **kwargs)
        setattr(SingleGPUCheckpointer, name, logging_call)

    for _name in ("save_checkpoint", "save_scheduler_state_dict", "save_val_metrics", "update_best_symlink"):
        _logged(_name)
'''


def test_one_rank_writes_each_checkpoint_while_the_other_waits(inputs, tmp_path, monkeypatch):
    """Two nodes on one filesystem, as a cluster's shared storage is: the checkpoint's files are written by
    torch's rank 0 alone. speculators' rank-0 rule reads the state its own launcher sets, not ours, so every
    rank called it and one rank read config.json while the other was writing it (JSONDecodeError)."""
    seam, log = tmp_path / "seam", tmp_path / "saves.log"
    seam.mkdir()
    (seam / "sitecustomize.py").write_text(SAVES_SEAM.format(log=str(log)))
    monkeypatch.setenv("PYTHONPATH", str(seam))  # the nodes' torchruns keep it (processes.nodes.node_env)
    outcomes = _two_nodes(_arguments(inputs, tmp_path / "two", epochs=2), rdzv_id="one-writer", callbacks={})
    result = outcomes[0]
    assert not isinstance(result, BaseException), result
    calls = log.read_text().split()
    per_epoch = ["save_checkpoint:0", "save_scheduler_state_dict:0", "save_val_metrics:0"]
    assert calls == per_epoch * 2 + ["update_best_symlink:0"], calls
    assert [c.epoch for c in result.checkpoints] == [0, 1]
    assert all((tmp_path / "two" / str(epoch) / "config.json").is_file() for epoch in (0, 1))
