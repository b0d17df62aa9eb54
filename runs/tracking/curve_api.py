"""Training curves as JSON: chart windows and full-resolution exports, answered by the API's
/api/v1/runs/<id>/metrics/ and .../metrics/export/ (runs.api.views.runs), which the run and compare pages
read with their session as scripts do with a token.

`GET /api/v1/runs/<id>/metrics/?keys=loss_0,full_acc_0&split=train&start=S&end=E&points=N` answers at
most N points per series over steps S..E (MinMaxLTTB, see runs.tracking.curves), each series with its
summary; a live page asks again from the step after the newest it holds, sending back its last answer's
ETag (a 304 while no point arrived; see poll_etag). Every parameter is checked; a bad one is a 400 naming it."""
from __future__ import annotations

import json

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

    def build():
        series = ([] if owner.training_run_id is None
                  else curves.curve_window(training_run_id=owner.training_run_id, query=query))
        return live.json_bytes({"run": owner.run_id, "start": query.start, "end": query.end, "points": query.points,
                                "series": series}), live.SETTLED_SECONDS

    key = ("curves", pk, owner.curve_changes, query)
    return live.json_answer_gzipped(request, key=key, tag=tag, body=live.cached(key, build))


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
