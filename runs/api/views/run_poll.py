"""The run page's one poll while its run trains (issue 40): the status's live part and the curves' new points in one
answer, after one read of the session, the user and the run's counters, where the page made two requests that each
paid that read and Django's own cost.

`GET /api/v1/runs/<id>/status/?since=V&curves_start=S` answers `{"status": ..., "curves": ...}`: `status` what
`?since=V` answers alone (the live part while the run's state is V, else the whole summary), `curves` what
`/metrics/?start=S&points=2000` answers (runs.tracking.curve_api), each the same bytes those endpoints cache for
every viewer (runs.live). Its ETag names the run's counters and which status part it holds, not S (as the curves'
poll: the page asks from the step after the newest it merged): 304 from the three reads while nothing moved. The
status and curves endpoints stay as they were, for the API's users and scripts."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.http import Http404, HttpRequest, HttpResponse

from runs import live
from runs.pipeline import selectors
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.status.live_summary import run_live_summary
from runs.pipeline.status.run_summary import run_summary
from runs.projects.visible_run import visible_run_row
from runs.tracking import curve_api, curves

# One statement (compiled once, with the project rule: runs.projects.visible_run) for both halves.
POLL_FIELDS = ("changes", "curve_changes", "state_changes", "training_run__pk")


def status_part(since: int | None, state_changes: int) -> str:
    """"live" while the caller holds the run's state (`since`), else "status": the whole summary."""
    return "live" if since is not None and since == state_changes else "status"


def status_body(*, user: AbstractBaseUser, pk: int, part: str, changes: int, state_changes: int) -> tuple[bytes, int]:
    """The status poll's JSON and how long it is kept, built by the first viewer after a change (runs.live): a running
    run's for RUNNING_SECONDS, since it says how long its stage has run."""
    def build():
        run = selectors.run_get(pk=pk, user=user)
        if part == "live":  # it holds the running stages alone
            summary = run_live_summary(run, state_version=state_changes)
            running = bool(summary["stages"])
        else:
            summary = {**run_summary(run), "state_version": state_changes}
            running = any(stage["status"] == StageStatus.RUNNING for stage in summary["stages"])
        seconds = live.RUNNING_SECONDS if running else live.SETTLED_SECONDS
        return (live.json_bytes(summary), seconds), seconds

    return live.cached((part, pk, changes), build)


def run_poll(request: HttpRequest, pk: int, *, since: int | None, curves_start: int) -> HttpResponse:
    """The status (as of `since`) and the curves after `curves_start`; Http404 outside the user's projects, checked
    in the counters' read, before any answer cached for every viewer."""
    row = visible_run_row(run_id=pk, user=request.user, fields=POLL_FIELDS)
    if row is None:
        raise Http404(f"no run {pk}")
    changes, curve_changes, state_changes, training_run_id = row
    part = status_part(since, state_changes)
    # `changes` moves with the curves too; curve_changes named anyway, so the ETag says what the curves half holds.
    tag = live.etag("run-poll", pk, changes, curve_changes, part)
    if unchanged := live.not_modified(request, tag):
        return unchanged
    query = curves.CurveQuery(start=curves_start, points=curves.DEFAULT_POINTS)
    key = ("run-poll", pk, changes, curve_changes, part, query)

    def build():
        status, seconds = status_body(user=request.user, pk=pk, part=part, changes=changes, state_changes=state_changes)
        _, window = curve_api.window_body(curves.CurveOwner(pk, training_run_id, curve_changes), query)
        return (b'{"status": ' + status + b', "curves": ' + window + b"}", seconds), seconds

    body, seconds = live.cached(key, build)
    return live.json_answer_gzipped(request, key=key, tag=tag, body=body, seconds=seconds)
