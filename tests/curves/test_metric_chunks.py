"""The chunk format of curves and the downsampling of charts, with no database."""
import numpy as np

from runs.tracking.chunks import (CHUNK_POINTS, downsample, OpenPoints, Points, pack, pack_one, preview, split_chunks, unpack,
                                  unpack_one)


def _points(n: int, start: int = 0) -> Points:
    steps = np.arange(start, start + n, dtype=np.int64)
    values = np.sin(steps / 50.0)
    return Points(steps=steps, epochs=steps / 1000.0, values=values, times=1.7e9 + steps * 0.1)


def test_pack_round_trips_every_column_exactly():
    p = _points(1000)
    back = unpack(pack(p))
    for name in ("steps", "epochs", "values", "times"):
        assert np.array_equal(getattr(back, name), getattr(p, name))
    one = unpack_one(pack_one(p))
    assert np.array_equal(one.values, p.values) and np.array_equal(one.steps, p.steps)


def test_split_fills_the_open_chunk_first_then_full_chunks():
    pieces = split_chunks(_points(2 * CHUNK_POINTS + 10), room_in_open=5)
    assert [len(p) for p in pieces] == [5, CHUNK_POINTS, CHUNK_POINTS, 5]
    assert np.array_equal(np.concatenate([p.steps for p in pieces]), np.arange(2 * CHUNK_POINTS + 10))


def test_window_is_inclusive_on_both_ends():
    w = _points(100).window(10, 20)
    assert w.steps[0] == 10 and w.steps[-1] == 20 and len(w) == 11


def test_preview_keeps_each_slice_extremes_and_every_spike():
    p = _points(CHUNK_POINTS)
    values = p.values.copy()
    values[1234] = 50.0  # a spike
    values[3000] = -40.0
    values[77] = np.nan  # not drawable: left out of the preview
    p = Points(steps=p.steps, epochs=p.epochs, values=values, times=p.times)
    pv = preview(p)
    assert len(pv) <= 2 * 64 + 2
    assert 1234 in pv.steps and 3000 in pv.steps and 77 not in pv.steps
    assert pv.steps[0] == 0 and pv.steps[-1] == CHUNK_POINTS - 1
    assert np.all(np.diff(pv.steps) > 0)


def test_downsample_returns_at_most_n_points_with_the_spikes():
    p = _points(200_000)
    values = p.values.copy()
    values[123_457] = 1e3
    values[50] = np.inf
    p = Points(steps=p.steps, epochs=p.epochs, values=values, times=p.times)
    shown = downsample(p, 2000)
    assert len(shown) <= 2000
    assert 123_457 in shown.steps and 50 not in shown.steps
    assert np.all(np.diff(shown.steps) > 0)
    small = downsample(_points(10), 2000)
    assert len(small) == 10


def test_open_points_are_known_only_at_the_version_and_count_they_were_kept_at_and_the_oldest_go_first():
    memory = OpenPoints(2)
    memory.keep(1, "100", _points(10))
    assert len(memory.get(1, "100", 10)) == 10
    assert memory.get(1, "101", 10) is None and memory.get(1, "100", 11) is None and memory.get(1, None, 10) is None
    memory.keep(2, "7", _points(3))
    memory.keep(1, "102", _points(4))  # kept again: now the newest
    memory.keep(3, "8", _points(5))  # one too many: series 2, kept longest ago, goes
    assert memory.get(2, "7", 3) is None and len(memory.get(1, "102", 4)) == 4 and len(memory.get(3, "8", 5)) == 5
    memory.forget(3)
    assert memory.get(3, "8", 5) is None


def test_a_full_chunks_preview_is_each_of_its_64_slices_first_lowest_and_first_highest_point():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 4, CHUNK_POINTS).astype(float)  # ties in every slice: the first one is kept
    values[1234] = 50.0
    p = Points(steps=np.arange(CHUNK_POINTS) * 3, epochs=np.zeros(CHUNK_POINTS), values=values,
               times=np.zeros(CHUNK_POINTS))
    size = CHUNK_POINTS // 64
    expected = {0, CHUNK_POINTS - 1}
    for lo in range(0, CHUNK_POINTS, size):
        part = list(values[lo:lo + size])
        expected |= {lo + part.index(min(part)), lo + part.index(max(part))}
    assert preview(p).steps.tolist() == [3 * i for i in sorted(expected)]
