"""A retried training continues from the resume state an earlier attempt saved, not from step 0.

The earlier attempt is stopped for real, as a lost worker stops: its progress callback raises in
the middle of an epoch, after everything it did was handed on. Its metrics are kept up to the step
the retry continues from (what `on_resume` is told), as the services keep them in the database.
On this CPU the resumed training runs the very same computations as an uninterrupted one (same
weights, optimizer moments, schedule and batch plan from the restored state), so weights, losses
and metrics must come out identical, not merely close.
"""
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.stages.train.test_train import run_train, write_training_inputs
from workers.stages.train.checkpoints.resume import state_path

NUM_ROWS = 16


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def inputs(tiny_target, tmp_path_factory):
    return write_training_inputs(tiny_target.target_dir, tiny_target.chats_path,
                                 tmp_path_factory.mktemp("resume-in"), num_rows=NUM_ROWS, draft_vocab_size=512)


class Recorder:
    """Metrics as the database keeps them: points past the step a retry continues from are dropped."""

    def __init__(self):
        self.points: list[dict] = []
        self.resumes: list[tuple[int, int]] = []

    def on_metrics(self, batch):
        self.points.extend(batch)

    def on_resume(self, step, epochs_done):
        self.resumes.append((step, epochs_done))
        self.points = [p for p in self.points if p["step"] <= step]


def attempt(inputs, out_dir, recorder, *, kill_at=None, **kwargs):
    def on_progress(done, total):
        if kill_at is not None and done >= kill_at:
            raise Killed(f"killed at step {done} of {total}")

    kwargs.setdefault("ttt_steps", 2)
    return run_train(inputs, out_dir, on_metrics=recorder.on_metrics, on_resume=recorder.on_resume,
                     on_progress=on_progress, **kwargs)


@pytest.fixture(scope="module")
def uninterrupted(inputs, tmp_path_factory):
    recorder = Recorder()
    result = attempt(inputs, tmp_path_factory.mktemp("whole") / "out", recorder)
    epoch0_steps = next(p["step"] for p in recorder.points if p["split"] == "val")
    assert 2 < epoch0_steps < result.steps  # the mid-epoch test is killed at step 2
    return SimpleNamespace(result=result, points=recorder.points, epoch0_steps=epoch0_steps)


def assert_same_training(resumed, recorder, uninterrupted):
    whole = uninterrupted.result
    assert resumed.steps == whole.steps
    assert resumed.train_tokens == whole.train_tokens
    assert resumed.loss_tokens_per_epoch == whole.loss_tokens_per_epoch
    assert resumed.loss_tokens_trained == whole.loss_tokens_trained == whole.loss_tokens_available
    assert resumed.best_epoch == whole.best_epoch
    assert [(c.epoch, c.train_loss, c.val_loss, c.is_best) for c in resumed.checkpoints] == \
        [(c.epoch, c.train_loss, c.val_loss, c.is_best) for c in whole.checkpoints]
    for mine, theirs in zip(resumed.checkpoints, whole.checkpoints):
        a, b = load_file(mine.path / "model.safetensors"), load_file(theirs.path / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the curves: one point per (key, split, step), steps rising, the same values as one attempt gives
    counts = Counter((p["key"], p["split"], p["step"]) for p in recorder.points)
    assert max(counts.values()) == 1
    for key, split in {(p["key"], p["split"]) for p in recorder.points}:
        steps = [p["step"] for p in recorder.points if (p["key"], p["split"]) == (key, split)]
        assert steps == sorted(set(steps))
    value = {(p["key"], p["split"], p["step"]): p["value"] for p in uninterrupted.points if p["key"] != "tokens_per_s"}
    assert {k: v for k, v in ((
        (p["key"], p["split"], p["step"]), p["value"]) for p in recorder.points) if k[0] != "tokens_per_s"} == value


def test_killed_in_the_second_epoch_it_resumes_from_the_first_epochs_end(inputs, uninterrupted, tmp_path, monkeypatch):
    # Every step's metrics handed on at once: whether the lost attempt had flushed past its saved state
    # must not hang on the 2-second flush timer (it did on a busy machine, and not on a quiet one).
    monkeypatch.setattr("workers.stages.train.loop.METRICS_FLUSH_STEPS", 1)
    out, recorder = tmp_path / "out", Recorder()
    kill_at = uninterrupted.epoch0_steps + 2
    with pytest.raises(Killed):
        attempt(inputs, out, recorder, kill_at=kill_at)
    assert max(p["step"] for p in recorder.points) >= kill_at - 1  # the lost attempt reported past its state
    assert state_path(out).exists() and (out / "0" / "model.safetensors").exists()
    resumed = attempt(inputs, out, recorder)
    assert recorder.resumes == [(0, 0), (uninterrupted.epoch0_steps, 1)]
    assert resumed.resumed_from_step == uninterrupted.epoch0_steps
    assert_same_training(resumed, recorder, uninterrupted)


def test_a_state_saved_within_an_epoch_resumes_mid_epoch(inputs, uninterrupted, tmp_path):
    out, recorder = tmp_path / "out", Recorder()
    with pytest.raises(Killed):
        attempt(inputs, out, recorder, kill_at=2, resume_every_steps=1)
    resumed = attempt(inputs, out, recorder, resume_every_steps=1)
    assert recorder.resumes == [(0, 0), (1, 0)] and resumed.resumed_from_step == 1
    assert_same_training(resumed, recorder, uninterrupted)


def test_a_finished_training_run_again_trains_no_step(inputs, uninterrupted, tmp_path):
    out, recorder = tmp_path / "out", Recorder()
    first = attempt(inputs, out, recorder, epochs=1)
    again = attempt(inputs, out, recorder, epochs=1, kill_at=first.steps + 1)  # any step trained would be killed
    assert recorder.resumes[-1] == (first.steps, 1) and again.resumed_from_step == again.steps == first.steps
    assert [c.train_loss for c in again.checkpoints] == [c.train_loss for c in first.checkpoints]
    assert again.tokens_per_second == pytest.approx(first.tokens_per_second, rel=0.05)  # the earlier attempt's speed


def test_other_settings_or_an_unreadable_state_start_over_from_step_0(inputs, uninterrupted, tmp_path):
    out, recorder = tmp_path / "out", Recorder()
    with pytest.raises(Killed):
        attempt(inputs, out, recorder, kill_at=uninterrupted.epoch0_steps + 1)
    with pytest.raises(Killed):  # another learning rate: the saved state is not this training's
        attempt(inputs, out, recorder, lr=1e-3, kill_at=uninterrupted.epoch0_steps + 1)
    assert recorder.resumes == [(0, 0), (0, 0)]
    assert (out / "0").exists()  # this learning rate's first epoch, and its state
    state = state_path(out)
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # cut short, as a full disk leaves it
    with pytest.raises(Killed):
        attempt(inputs, out, recorder, lr=1e-3, kill_at=2)
    assert recorder.resumes[-1] == (0, 0)
    assert all(p["step"] <= 2 for p in recorder.points)  # the earlier attempts' curves went at the restart
    assert not (out / "0").exists()  # the epoch the unreadable state stood for is trained again
