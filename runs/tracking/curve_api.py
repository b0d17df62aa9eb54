"""Training curves as JSON: chart windows and full-resolution exports, answered by the API's
/api/v1/runs/<id>/metrics/ and .../metrics/export/ (runs.api.views.runs), which the run and compare pages
read with their session as scripts do with a token.

`GET /api/v1/runs/<id>/metrics/?keys=loss_0,full_acc_0&split=train&start=S&end=E&points=N` answers at
most N points per series over steps S..E (MinMaxLTTB, see runs.tracking.curves), each series with its
summary; a live page asks again from the step after the newest it holds, sending back its last answer's
ETag (a 304 while no point arrived; see poll_etag). Every parameter is checked; a bad one is a 400 naming it."""
from __future__ import annotations

import json

import numpy as np
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from runs.tracking import curves
from runs.tracking.metric_names import RULE, is_metric_name, metric_name_shown
from runs import live
from workers.contract.errors import InputError

MAX_STEP = 2**62
SPLITS = ("", "train", "val", "system")  # empty: train and val; system: what the workers sampled


def _int(request: HttpRequest, name: str, *, low: int, high: int, default: int | None) -> int | None:
    text = request.GET.get(name, "")
    if text == "":
        return default
    if len(text) > 20 or not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise InputError(f"{name} must be an integer from {low} to {high}, got {text[:40]!r}")
    return int(text)


def _split(request: HttpRequest) -> str:
    split = request.GET.get("split", "")
    if split not in SPLITS:
        raise InputError(f"split must be train, val or system (or empty for train and val), got {split[:40]!r}")
    return split


def _keys(text: str) -> tuple[str, ...]:
    keys = tuple(k for k in text.split(",") if k) if text else ()
    if len(keys) > curves.MAX_KEYS:
        raise InputError(f"keys names {len(keys)} series; at most {curves.MAX_KEYS} per request")
    for key in keys:
        if not is_metric_name(key):
            raise InputError(f"keys: {metric_name_shown(key)} is not a metric name ({RULE})")
    return keys


# The whole curves (12 series of 1,500 points on a run page's load) are some 70,000 numbers: json.dumps turned
# each into a Python object and then text. Epochs and times (rounded to 6 and 3 decimals) are written here from
# their digits, all series' columns at once in numpy; steps and values by json.dumps, whose int and
# float.__repr__ per number nothing here beats (numpy's own shortest text of a float is no quicker). The text is the same,
# byte for byte, as live.json_bytes of the same answer with the columns as lists (tests/curves/test_curve_json.py); an array
# this cannot write (NaN, infinities, -0.0, a negative, past 15 digits, below 1e-4) goes through json.dumps.
_ROUNDED = {"epochs": 6, "times": 3}  # decimals, as curves.curve_window_columns rounds them


def _exact_decimals(column: np.ndarray, decimals: int) -> tuple[np.ndarray, np.ndarray]:
    """k (int64) with column == k / 10**decimals, written by repr as k's digits with the point put in: true where
    the float is the one nearest that decimal (the division is exact to half a unit), k has at most 15 digits
    (DBL_DIG: no shorter decimal gives the same float, so repr's shortest is this one) and repr writes it without
    an exponent (0, or 1e-4 and up). Negatives and -0.0 are left to json.dumps."""
    scale = 10.0 ** decimals
    with np.errstate(all="ignore"):
        k = np.rint(column * scale)
        ok = (np.isfinite(column) & (k >= 0) & (k < 1e15) & (k / scale == column) & ~np.signbit(column)
              & ((k == 0) | (k >= 10 ** max(decimals - 4, 0))))
    return np.where(ok, k, 0).astype(np.int64), ok


def _digit_text(k: np.ndarray, decimals: int) -> tuple[bytes, np.ndarray]:
    """Every k (>= 0) as its decimal text with `decimals` after the point (trailing zeros dropped, one kept), each
    followed by ", "; and where each one's text ends in those bytes."""
    n = len(k)
    width = max(len(str(int(k.max()))), decimals + 1)  # digits of the longest, the units digit at least
    units = width - decimals
    point = 1 if decimals else 0
    chars = np.empty((n, width + point + 2), np.uint8)
    keep = np.ones(chars.shape, bool)
    rest = k.copy()
    for column in range(width - 1, -1, -1):  # the last digit first
        rest, digit = np.divmod(rest, 10)
        chars[:, column + point * (column >= units)] = digit + 48
    for column in range(units - 1):  # a leading zero is not written; the units digit is
        keep[:, column] = k >= 10 ** (width - 1 - column)
    if decimals:
        chars[:, units] = ord(".")
        for place in range(1, decimals):  # a trailing zero of the fraction is not written; its first digit is
            keep[:, units + 1 + place] = k % 10 ** (decimals - place) != 0
    chars[:, -2:] = np.frombuffer(b", ", np.uint8)
    return chars[keep].tobytes(), np.cumsum(keep.sum(axis=1))


def column_lists(columns: list[np.ndarray], decimals: int | None) -> list[str]:
    """Each column as the JSON list json.dumps(column.tolist()) writes; `decimals`: how the columns were rounded
    (None: not rounded, as steps and values)."""
    if decimals is None:  # as quick as joining their reprs: json.dumps does just that, for an int too
        return [json.dumps(c.tolist()) for c in columns]
    lists: list[str | None] = [None if len(c) else "[]" for c in columns]
    todo = [i for i, c in enumerate(columns) if len(c)]
    if todo:
        k, ok = _exact_decimals(np.concatenate([columns[i] for i in todo]), decimals)
        text, ends = _digit_text(k, decimals)
        at = 0
        for i in todo:
            n = len(columns[i])
            if ok[at:at + n].all():
                start = int(ends[at - 1]) if at else 0
                lists[i] = "[" + text[start:int(ends[at + n - 1]) - 2].decode() + "]"
            else:
                lists[i] = json.dumps(columns[i].tolist())
            at += n
    return lists


def window_json(head: dict, series: list[dict]) -> bytes:
    """live.json_bytes({**head, "series": series}) with each series' columns (curves.COLUMN_NAMES, its last keys)
    numpy arrays, as curves.curve_window_columns gives them; the same bytes."""
    names = curves.COLUMN_NAMES
    lists = {name: column_lists([s[name] for s in series], _ROUNDED.get(name)) for name in names}
    parts = []
    for i, s in enumerate(series):
        scalars = json.dumps({k: v for k, v in s.items() if k not in names}, cls=DjangoJSONEncoder)
        parts.append(scalars[:-1] + "".join(f', "{name}": {lists[name][i]}' for name in names) + "}")
    return (json.dumps(head, cls=DjangoJSONEncoder)[:-1] + ', "series": [' + ", ".join(parts) + "]}").encode()


QUERY_PARAMS = ("keys", "split", "start", "end", "points")


def curve_query(request: HttpRequest) -> curves.CurveQuery:
    unknown = sorted(set(request.GET) - set(QUERY_PARAMS))
    if unknown:
        # An old client's `after` would otherwise be ignored and get every point again.
        raise InputError(f"unknown parameter {unknown[0][:40]!r} (known: {', '.join(QUERY_PARAMS)})")
    start = _int(request, "start", low=0, high=MAX_STEP, default=None)
    end = _int(request, "end", low=0, high=MAX_STEP, default=None)
    if start is not None and end is not None and end < start:
        raise InputError(f"end ({end}) is before start ({start})")
    return curves.CurveQuery(
        keys=_keys(request.GET.get("keys", "")), split=_split(request), start=start, end=end,
        points=_int(request, "points", low=3, high=curves.MAX_POINTS, default=curves.DEFAULT_POINTS),
    )


def poll_etag(pk: int, curve_changes: int, query: curves.CurveQuery) -> str:
    """The ETag of an answer: the curves' change counter and the query. A live poll's (`start` given, no
    `end`) leaves its start out: it names the curves' state, so a page that merged that answer and asks
    from the step after the newest it holds gets 304 while no point arrived, though its start moved."""
    if query.start is not None and query.end is None:
        return live.etag("curves-poll", pk, curve_changes, query.keys, query.split, query.points)
    return live.etag("curves", pk, curve_changes, query)


def run_metrics(request: HttpRequest, pk: int) -> HttpResponse:
    """304 while the run's curves took no point (the ETag: poll_etag), else the answer cached for every
    viewer asking the same until a point arrives, gzipped once for those that take it (runs.live)."""
    # With the counter, read first: the points read after are newer. Http404 outside the user's projects.
    owner = curves.curve_owner(run_id=pk, user=request.user)
    try:
        query = curve_query(request)
    except InputError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    tag = poll_etag(pk, owner.curve_changes, query)
    if unchanged := live.not_modified(request, tag):
        return unchanged
    key, body = window_body(owner, query)
    return live.json_answer_gzipped(request, key=key, tag=tag, body=body)


def window_body(owner: curves.CurveOwner, query: curves.CurveQuery) -> tuple[tuple, bytes]:
    """The answer's JSON and its cache key: built by the first viewer asking the same after a point arrived, read
    by the others (runs.live); the run page's one poll embeds the same (runs.api.views.run_poll)."""
    def build():
        series = ([] if owner.training_run_id is None
                  else curves.curve_window_columns(training_run_id=owner.training_run_id, query=query))
        head = {"run": owner.run_id, "start": query.start, "end": query.end, "points": query.points}
        return window_json(head, series), live.SETTLED_SECONDS

    key = ("curves", owner.run_id, owner.curve_changes, query)
    return key, live.cached(key, build)


def _csv_rows(points_iter):
    yield "step,epoch,value,time\n"
    for points in points_iter:
        yield "".join(f"{s},{e!r},{v!r},{t!r}\n" for s, e, v, t in
                      zip(points.steps.tolist(), points.epochs.tolist(), points.values.tolist(), points.times.tolist()))


def _json_rows(series_head: dict, points_iter):
    yield json.dumps(series_head)[:-1] + ', "points": ['
    first = True
    for points in points_iter:
        rows = zip(points.steps.tolist(), points.epochs.tolist(), points.values.tolist(), points.times.tolist())
        # NaN and infinities are kept: JSON has no literal for them, so they travel as strings.
        text = ",".join(json.dumps([s, e, v if v == v and abs(v) != float("inf") else str(v), t]) for s, e, v, t in rows)
        if text:
            yield ("" if first else ",") + text
            first = False
    yield "]}"


def run_metrics_export(request: HttpRequest, pk: int):
    """One series at full resolution: `?key=loss_0&split=train&format=csv|json`."""
    owner = curves.curve_owner(run_id=pk, user=request.user)
    try:
        keys = _keys(request.GET.get("key", ""))
        split = _split(request)
        fmt = request.GET.get("format", "csv")
        if len(keys) != 1 or not split:
            raise InputError("export names one series: key=<metric> and split=train, val or system")
        if fmt not in ("csv", "json"):
            raise InputError(f"format must be csv or json, got {fmt[:20]!r}")
        series = curves.curve_series(training_run_id=owner.training_run_id or 0,
                                     query=curves.CurveQuery(keys=keys, split=split)).first()
        if series is None:
            raise InputError(f"run {owner.run_id} has no {split} series {keys[0]!r}")
    except InputError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    name = f"run{owner.run_id}-{split}-{series.key}.{fmt}"
    chunks = curves.series_chunks(series=series)
    if fmt == "csv":
        response = StreamingHttpResponse(_csv_rows(chunks), content_type="text/csv")
    else:
        head = {"run": owner.run_id, **curves.series_summary(series), "columns": ["step", "epoch", "value", "time"]}
        response = StreamingHttpResponse(_json_rows(head, chunks), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
