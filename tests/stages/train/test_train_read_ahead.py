"""The training loop's read-ahead thread (workers.stages.train.step.stepper.read_ahead), without pinning:
pinned memory needs CUDA, which the CUDA path adds on top of exactly this."""
import threading
import time

import pytest
import torch

from workers.stages.train.step.stepper import prefetch, read_ahead


def counted(n, produced, fail_at=None):
    for i in range(n):
        if i == fail_at:
            raise OSError(f"hs_{i}.safetensors: unreadable")
        produced.append(i)
        yield {"i": torch.tensor([i])}


def test_batches_arrive_in_order_and_the_thread_reads_at_most_depth_ahead():
    produced = []
    got = []
    for batch in read_ahead(counted(20, produced), depth=2, pin=False):
        time.sleep(0.02)  # a slow step: the reader fills the queue and waits
        # in flight: the one being yielded, `depth` queued, one held by a reader blocked on the full queue
        assert len(produced) - len(got) <= 2 + 2
        got.append(int(batch["i"]))
    assert got == list(range(20))


def test_a_read_error_is_raised_at_the_batch_it_happened_on():
    produced = []
    got = []
    with pytest.raises(OSError, match="hs_5.safetensors"):
        for batch in read_ahead(counted(20, produced, fail_at=5), depth=2, pin=False):
            got.append(int(batch["i"]))
    assert got == [0, 1, 2, 3, 4]


def test_stopping_early_ends_the_reader_thread():
    produced = []
    before = threading.active_count()
    iterator = read_ahead(counted(1000, produced), depth=2, pin=False)
    next(iterator)
    iterator.close()  # the loop raised (a stop request, say): the reader must not go on
    assert threading.active_count() == before
    assert len(produced) < 10


def test_the_cpu_reads_in_line():
    batches = iter([{"i": torch.tensor([0])}])
    assert prefetch(batches, device=torch.device("cpu")) is batches
