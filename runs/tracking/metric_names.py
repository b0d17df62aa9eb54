"""The one rule for a metric's name (a series' key), applied where keys come in (the workers' write path,
points reported through the API) and where they are asked for (the curves API and its export).

ASCII letters, digits and `_ . - /`, 1 to 50 characters: every key our trainings write (loss, loss_0,
full_acc_0, cond_acc_0, lr, tokens_per_s, tokens_seen, epoch) and every one the client reports from
speculators' trainer (the same names, workers.stages.train.results.METRIC_KEY) fits it. Markup, quotes,
spaces, control characters and bidirectional marks do not, so a stored key can be exported by the name
it was stored under and is plain text on every page (the pages treat it as text all the same)."""
from __future__ import annotations

import re
from collections import defaultdict
from operator import itemgetter

from workers.contract.errors import InputError

MAX_CHARS = 50  # MetricSeries.key
RULE = f"ASCII letters, digits, _ . - /; 1 to {MAX_CHARS} characters"
_NAME = re.compile(rf"[A-Za-z0-9_.\-/]{{1,{MAX_CHARS}}}")


def is_metric_name(key: object) -> bool:
    return isinstance(key, str) and _NAME.fullmatch(key) is not None


def metric_name_shown(key: object) -> str:
    """A refused key for a message: quoted, cut, with what cannot be seen spelt out (repr escapes NUL and
    U+202E), so the person reads what was sent."""
    return ascii(str(key)[:60])


def points_by_series(points: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Points ({split, key, ...}) by (split, key); InputError on the first key that is not a metric name. Each key
    is checked once, and a batch of one series (a worker's often is) stays the list it came as."""
    try:
        splits, keys = set(map(itemgetter("split"), points)), set(map(itemgetter("key"), points))
        if len(splits) == len(keys) == 1:  # no tuple per point
            _name_check(next(iter(keys)))
            return {(str(next(iter(splits))), next(iter(keys))): points}
        pairs = list(map(_SPLIT_KEY, points))
        names = {pair: (str(pair[0]), pair[1]) for pair in set(pairs)}
    except TypeError:  # a split or key no dict holds (a list): every key checked, every split spelt out
        for key in map(itemgetter("key"), points):
            _name_check(key)
        pairs = [(str(p["split"]), p["key"]) for p in points]
        names = {pair: pair for pair in set(pairs)}
    for _, key in names.values():
        _name_check(key)
    by_series: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p, pair in zip(points, pairs):
        by_series[names[pair]].append(p)
    return by_series


_SPLIT_KEY = itemgetter("split", "key")


def _name_check(key) -> None:
    if not is_metric_name(key):
        raise InputError(f"metric key {metric_name_shown(key)} is not a metric name ({RULE})")
