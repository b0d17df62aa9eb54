"""The one rule for a metric's name (a series' key), applied where keys come in (the workers' write path,
points reported through the API) and where they are asked for (the curves API and its export).

ASCII letters, digits and `_ . - /`, 1 to 50 characters: every key our trainings write (loss, loss_0,
full_acc_0, cond_acc_0, lr, tokens_per_s, tokens_seen, epoch) and every one the client reports from
speculators' trainer (the same names, workers.stages.train.results.METRIC_KEY) fits it. Markup, quotes,
spaces, control characters and bidirectional marks do not, so a stored key can be exported by the name
it was stored under and is plain text on every page (the pages treat it as text all the same)."""
from __future__ import annotations

import re

MAX_CHARS = 50  # MetricSeries.key
RULE = f"ASCII letters, digits, _ . - /; 1 to {MAX_CHARS} characters"
_NAME = re.compile(rf"[A-Za-z0-9_.\-/]{{1,{MAX_CHARS}}}")


def is_metric_name(key: object) -> bool:
    return isinstance(key, str) and _NAME.fullmatch(key) is not None


def metric_name_shown(key: object) -> str:
    """A refused key for a message: quoted, cut, with what cannot be seen spelt out (repr escapes NUL and
    U+202E), so the person reads what was sent."""
    return ascii(str(key)[:60])
