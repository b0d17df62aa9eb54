"""Fixtures the training stage's modules share: real hidden states of the tiny target, and one torch thread."""
import pytest


@pytest.fixture(scope="session")
def training_inputs(tiny_target, tmp_path_factory):
    """`training_inputs(num_rows=, draft_vocab_size=)`: the target's hidden states for its first chats in
    speculators 0.9 layout (tests.stages.train.test_train.write_training_inputs), built once per shape and session.
    Treat them as read-only: every module asking for the same shape gets the same folder."""
    from tests.stages.train.test_train import write_training_inputs

    built: dict[tuple[int, int], object] = {}

    def inputs(*, num_rows: int, draft_vocab_size: int):
        key = (num_rows, draft_vocab_size)
        if key not in built:
            built[key] = write_training_inputs(tiny_target.target_dir, tiny_target.chats_path,
                                               tmp_path_factory.mktemp(f"train-in-{num_rows}-{draft_vocab_size}"),
                                               num_rows=num_rows, draft_vocab_size=draft_vocab_size)
        return built[key]

    return inputs


@pytest.fixture
def one_torch_thread():
    """One torch thread while the test runs, as a worker's pool process sets it (a training started from here,
    in a child or a torchrun, takes this process's count); the count before is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
