"""The whole curves' JSON written from numpy (runs.tracking.curve_api.window_json) is the text json.dumps writes
for the same answer with its columns as lists, byte for byte, hostile values included (issue 40)."""
import json
import math

import numpy as np
import pytest

from runs import live
from runs.tracking.curve_api import window_json
from runs.tracking.curves import COLUMN_NAMES

HEAD = {"run": 7, "start": None, "end": None, "points": 2000}
HOSTILE = [0.0, -0.0, 1.0, 10.0, 100.0, 0.001, 0.5, 1e-4, 1e-5, 1.5e-4, 5e-324, 1e308, -1e308, float("nan"), float("inf"),
           float("-inf"), 1e15, 1e16, 999999999999.999, 123456789012.345, 1765050000.123, 2.0**53, 0.1 + 0.2, -3.25]


def _series(steps, epochs, values, times, key="loss_0"):
    return {"split": "train", "key": key, "num_points": len(steps), "last": None, "min": 0.5, "downsampled": False,
            "steps": np.asarray(steps, np.int64), "epochs": np.round(np.asarray(epochs, np.float64), 6),
            "values": np.asarray(values, np.float64), "times": np.round(np.asarray(times, np.float64), 3)}


def _plain(series):
    """The answer as it was built before: the columns as lists, through json.dumps (live.json_bytes)."""
    return live.json_bytes({**HEAD, "series": [{k: v.tolist() if k in COLUMN_NAMES else v for k, v in s.items()}
                                               for s in series]})


def _same_values(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_values, a, b))
    return type(a) is type(b) and a == b


def _check(series):
    fast, plain = window_json(HEAD, series), _plain(series)
    assert _same_values(json.loads(fast), json.loads(plain))
    assert fast == plain


def test_hostile_values_each_in_every_float_column():
    n = len(HOSTILE)
    steps = [0, 1, 2**53 + 1, 2**62 - 1, 2**62] + list(range(10, 10 + n - 5))
    _check([_series(steps, HOSTILE, HOSTILE, HOSTILE)])
    for i, value in enumerate(HOSTILE):  # alone in an otherwise ordinary column, whichever column it is in
        plain = [1765050000.0 + j * 0.25 for j in range(n)]
        odd = plain[:i] + [value] + plain[i + 1:]
        _check([_series(steps, odd, plain, plain, "a"), _series(steps, plain, plain, odd, "b"),
                _series(steps, plain, odd, plain, "c")])


def test_negative_and_huge_steps():
    _check([_series([-5, 0, 2**62], [0, 0, 0], [1, 2, 3], [1, 2, 3]), _series([3, 2**63 - 1], [1, 2], [1, 2], [1, 2])])


def test_empty_and_one_point_series():
    _check([])
    _check([_series([], [], [], [], "a"), _series([4], [0.001], [2.5], [1765050000.5], "b")])


@pytest.mark.parametrize("scale", [1e-7, 1e-4, 1e-2, 1.0, 1e3, 1e6, 1.7e9, 1e11, 1e13, 1e17])
def test_random_columns_at_every_magnitude(scale):
    rng = np.random.default_rng(int(math.log10(scale) * 10) + 100)
    n = 3000
    draw = lambda: rng.random(n) * scale * rng.choice([1, 1, 1, 10, 0.1], n)  # noqa: E731
    steps = np.cumsum(rng.integers(1, 10**6, n))
    _check([_series(steps[:1500], draw()[:1500], rng.normal(0, scale, 1500), draw()[:1500], "a"),
            _series(steps, draw(), rng.normal(0, scale, n), draw(), "b")])


def test_a_column_not_rounded_as_said_still_comes_out_as_json_dumps_writes_it():
    rough = np.array([1765050000.1234567, 0.1 + 0.2, 2.0 / 3.0])
    series = _series([1, 2, 3], [0, 0, 0], [1, 2, 3], [0, 0, 0])
    _check([{**series, "epochs": rough, "times": rough}])
