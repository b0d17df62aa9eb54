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
