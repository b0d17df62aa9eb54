"""/api/v1/runs/: the runs list (filters, sort, pages), a run's summary, launching, cancelling,
retrying, tagging and copying runs, its stages, attempts and curves. Thin: parse, call a selector or a
service, answer; refusals are the services' (runs.roles.require_on_run for acting on a run).

Runs trained elsewhere (a body with `"external": true`, POST on RunMetrics, checkpoints, end) are
runs.api.views.external's."""
from __future__ import annotations

import json
import re

from django.http import Http404, HttpResponse
from rest_framework.response import Response

from runs.api.bodies import idempotency, launch
from runs.api import shapes
from runs.api.views import external as views_external, run_poll
from runs.api.shapes import launched as _launched, run_answer
from runs.api.base import ApiInputError, ApiView, error_response, paged
from runs.api.bodies.serializers import (CopySerializer, EmptySerializer, ExternalRunSerializer, LaunchSerializer,
                                  PointsSerializer, TagsSerializer)
from runs.pipeline.status import changes
from runs.pipeline.online import services as online_services
from runs.pipeline import selectors, services
from runs.pipeline.status.run_summary import run_summary
from runs.projects import access
from runs.review import tags as tag_services
from runs.tracking import curve_api
from runs.tracking.runs_list import run_filters, run_table
from runs import live

LIST_PARAMS = run_filters.PARAMS  # and setting.<name>


class RunList(ApiView):
    """The runs list, as the runs page filters, sorts and pages it."""

    # A body with "external" is a run trained elsewhere (runs.api.views.external), checked by its own serializer.
    request_serializers = {"POST": LaunchSerializer, "POST external": ExternalRunSerializer}
    field_names = launch.BODY_NAMES
    query_params = {"GET": [
        ("q", "string", "search names, targets, datasets, owners, exact tags, or a run id"),
        ("status", "string", f"one of {', '.join(run_filters.STATUSES)} (held: a sweep's run its sweep has not "
                             "handed to the queues yet; each row's status_reason says why)", run_filters.STATUSES),
        ("target", "string", "target name"), ("dataset", "string", "dataset name"),
        ("owner", "string", "owner's username"), ("tag", "string", "a tag"),
        ("project", "string", "a project's name (only the projects you are a member of are ever listed)"),
        ("sweep", "integer", "a sweep's id"), ("tau_min", "number", "τ at least"), ("tau_max", "number", "τ at most"),
        ("archived", "string", "empty: archived runs left out; with: shown too; only: them alone", run_filters.ARCHIVED),
        ("settings", "string", "settings the run launched with, `epochs=2; lr=0.0003` (or one parameter each: "
                               "setting.epochs=2)"),
        ("columns", "string", f"comma-separated, of {', '.join(run_filters.COLUMN_KEYS)} (the page's columns)"),
        ("sort", "string", f"{', '.join(run_filters.SORTS)}; '-' first for descending (default -created)"),
        ("page", "integer", f"from 1; {run_table.PAGE_SIZE} runs a page")]}
    header_params = {"POST": [
        (idempotency.HEADER, "string", "optional, 1-200 characters without control characters (a uuid4): the "
                                       "same key and body again within 24 h answer the run the first request "
                                       "made (200) instead of launching another; with another body, 409")]}
    responses = {"GET": {"200": "{count, page, pages, page_size, next, previous, results: [run rows]}"},
                 "POST": {"201": "the launched run, as GET /api/v1/runs/<id>/ answers it (`id` first)",
                          "200": "a repeat of an earlier launch's Idempotency-Key and body within 24 h: that run, "
                                 "as it is now (header Idempotent-Replayed: true); nothing launched",
                          "409": "the Idempotency-Key was used within 24 h with another body; nothing launched"}}

    def get(self, request):
        """The runs, newest first unless sorted otherwise, a page at a time.

        Unknown parameters are refused (400) rather than ignored: a misspelt filter would otherwise
        answer every run."""
        unknown = sorted(name for name in set(request.query_params) - set(LIST_PARAMS)
                         if not name.startswith(run_filters.SETTING_PREFIX))
        if unknown:
            raise ApiInputError(f"unknown parameter {unknown[0][:40]!r} (known: {', '.join(LIST_PARAMS)})",
                                field=unknown[0][:40])
        try:
            filters = run_filters.RunFilters.from_query(request.query_params)
        except run_filters.RunTableError as exc:
            field = next((p for p in LIST_PARAMS if str(exc).startswith(p)), None)
            raise ApiInputError(str(exc), field=field) from None
        page, total = run_table.run_table(filters=filters, visible=access.visible_project_ids(request.user))
        return Response(paged(request, items=[shapes.run_row(run, request) for run in page.object_list],
                              total=total, page=page.number, pages=page.paginator.num_pages,
                              page_size=run_table.PAGE_SIZE))

    def post(self, request):
        """Launch a run: the launch form's checks, then what the page's Launch button does.

        The body names run_pipeline's options in snake case; `layer_ids` is a list of integers.
        Refused with 400 naming the field, and nothing stored, where the form refuses.

        A run trained elsewhere instead: `{"external": true, "name": ..., "config": {...the trainer's
        settings...}}` (and `target`, `dataset` paths when the trainer names them). Nothing of it is queued;
        its client reports its curves (POST .../metrics/), checkpoints (.../checkpoints/) and end (.../end/).

        Either may carry an `Idempotency-Key` header, so that a client sends it again safely when its answer
        was lost: the same key and body within 24 h answer the first request's run (200), once launched."""
        if isinstance(request.data, dict) and "external" in request.data:
            return idempotency.answer_once(request, launch=lambda: views_external.external_run_create(self, request))
        return idempotency.answer_once(request, launch=lambda: self._launch(request))

    def _launch(self, request):
        form = launch.launch_form(self.body())
        run = services.run_launch(user=request.user, target_path=form.cleaned_data["target_path"],
                                  dataset_path=form.cleaned_data["dataset_path"], config=form.run_config(),
                                  name=form.cleaned_data["name"], project=form.cleaned_data["project"],
                                  notes=form.cleaned_data["notes"])
        return _launched(run, request)


class RunDetail(ApiView):
    responses = {"GET": {"200": "the run summary: stages, tokens, checkpoints, acceptance, config, tags"}}

    def get(self, request, pk: int):
        """One run: what run_pipeline --json prints and the run page polls, with `id` and `tags`."""
        return Response(run_answer(pk, request))


class RunStatus(ApiView):
    query_params = {"GET": [("since", "integer", "the state_version of the whole summary the caller holds: while "
                                                 "the run's state has not moved since, only what moves while it "
                                                 "runs (live: true)"),
                            ("curves_start", "integer", "with it, the answer is {status, curves}: curves what "
                                                        "/metrics/?start=<it>&points=2000 answers (the run page's "
                                                        "one poll while the run trains)")]}
    responses = {"GET": {"200": "the run summary alone (no tags, owner or links) with its state_version, or with "
                                "?since= its live part; with ?curves_start= both it and the new curve points as "
                                "{status, curves}; with an ETag",
                         "304": "If-None-Match named the ETag and nothing the summary shows changed; no body"}}

    def get(self, request, pk: int):
        """The run summary a live page polls: 304 while the run's change counter stands still (one query),
        else the summary cached for every viewer until the counter moves (runs.live).

        With `since` (the `state_version` of the summary the caller holds) and no state change since: the
        live part alone (runs.pipeline.status.live_summary), what a training moves every few seconds. With
        `curves_start` too: that and the curves' points after it, in one answer (runs.api.views.run_poll).

        Apart from the run's detail, which adds tags and the queue's hand-over: those do not move the
        change counter (runs.pipeline.status.changes), so an ETag of the counter would keep them stale."""
        since, curves_start = (_whole_number(request, name) for name in ("since", "curves_start"))
        if curves_start is not None:
            return run_poll.run_poll(request._request, pk, since=since, curves_start=curves_start)
        # First: the rows read after it are at least this new. With the user: 404 outside their projects,
        # checked before the answer cached for every viewer.
        counters = changes.run_counters(run_id=pk, user=request.user)
        if counters is None:
            raise Http404(f"no run {pk}")
        part = run_poll.status_part(since, counters.state_changes)
        tag = live.etag(part, pk, counters.changes)
        if unchanged := live.not_modified(request._request, tag):
            return unchanged
        body, _ = run_poll.status_body(user=request.user, pk=pk, part=part, changes=counters.changes,
                                       state_changes=counters.state_changes)
        return live.json_answer(tag=tag, body=body)


def _whole_number(request, name: str) -> int | None:
    text = request.query_params.get(name)
    if text is not None and not (text.isascii() and text.isdigit() and len(text) <= 18):
        what = "the state_version of a summary" if name == "since" else "a step"
        raise ApiInputError(f"{name} must be a whole number: {what}", field=name)
    return None if text is None else int(text)


class RunCancel(ApiView):
    request_serializers = {"POST": EmptySerializer}
    responses = {"POST": {"200": "{id, cancelled: how many unfinished stages were cancelled}"}}

    def post(self, request, pk: int):
        """Cancel the run's unfinished stages (its owner, an admin, or a teammate the owner allowed)."""
        self.body()
        run = selectors.run_get(pk=pk, stages=False, user=request.user)
        return Response({"id": run.pk, "cancelled": services.run_cancel(run=run, user=request.user)})


class RunRetry(ApiView):
    request_serializers = {"POST": EmptySerializer}
    responses = {"POST": {"200": "{id, queued: how many failed or cancelled stages were queued again}"}}

    def post(self, request, pk: int):
        """Queue the run's failed and cancelled stages again; refused (400) when no live worker takes one."""
        self.body()
        run = selectors.run_get(pk=pk, stages=False, user=request.user)
        return Response({"id": run.pk, "queued": services.run_retry(run=run, user=request.user)})


class RunKeepCache(ApiView):
    request_serializers = {"POST": EmptySerializer}
    responses = {"POST": {"200": "{id, keep: queued}: a worker writes the online run's cache as its extraction"}}

    def post(self, request, pk: int):
        """"Keep the cache" of a finished online run: a worker writes it as the run's own extraction, for reuse;
        refused (400) unless the cache holds every prepared row (the message says how many are missing)."""
        self.body()
        run = selectors.run_get(pk=pk, user=request.user)
        online_services.online_keep_request(run=run, user=request.user)
        return Response({"id": run.pk, "keep": "queued"})


class RunTags(ApiView):
    request_serializers = {"POST": TagsSerializer}
    responses = {"POST": {"200": "{id, tags: the run's tags now}"}}

    def post(self, request, pk: int):
        """Replace the run's tags (its owner, an admin, or a teammate the owner allowed)."""
        names = self.body()["tags"]
        if any("," in name for name in names):
            raise ApiInputError("a tag may not hold a comma (the runs page separates tags with commas)", field="tags")
        run = selectors.run_get(pk=pk, stages=False, user=request.user)
        try:
            names = tag_services.run_tags_set(run=run, text=", ".join(names), user=request.user)
        except tag_services.TagError as exc:
            raise ApiInputError(str(exc), field="tags") from None
        return Response({"id": run.pk, "tags": names})


class RunCopy(ApiView):
    request_serializers = {"POST": CopySerializer}
    field_names = launch.BODY_NAMES
    responses = {"POST": {"201": "the new run, as GET /api/v1/runs/<id>/ answers it"}}

    def post(self, request, pk: int):
        """Launch a copy of the run, with the body's settings changed (the page's Launch a copy)."""
        body = self.body()
        base = selectors.launch_copy_initial(run_id=str(pk), user=request.user)
        if base is None:
            return error_response(f"no run {pk} to copy", code=404)
        form = launch.launch_form(body, base=base)
        run = services.run_launch(user=request.user, target_path=form.cleaned_data["target_path"],
                                  dataset_path=form.cleaned_data["dataset_path"], config=form.run_config(),
                                  name=form.cleaned_data["name"], project=form.cleaned_data["project"],
                                  notes=form.cleaned_data["notes"])
        return _launched(run, request)


class RunStages(ApiView):
    responses = {"GET": {"200": "{run, stages: [{name, status, progress, started_at, finished_at, error, ...}]}"}}

    def get(self, request, pk: int):
        """The run's five stages (prepare, extract, vocab, train, evaluate) as the run summary has them."""
        summary = run_summary(selectors.run_get(pk=pk, user=request.user))
        return Response({"run": pk, "status": summary["status"], "stages": summary["stages"]})


class RunAttempts(ApiView):
    responses = {"GET": {"200": "{run, attempts: [{stage, number, worker, outcome, error, ...}]}"}}

    def get(self, request, pk: int):
        """Every attempt at the run's stages: which worker, how it ended (a lost worker's stage is tried again)."""
        summary = run_summary(selectors.run_get(pk=pk, user=request.user))
        return Response({"run": pk, "attempts": summary["attempts"]})


def _curve_answer(response: HttpResponse) -> HttpResponse:
    """The curves API's own answer, its 400 in the API's error shape (the parameter to blame named)."""
    if response.status_code != 400:
        return response
    message = json.loads(response.content).get("error", "bad parameter")
    unknown = re.match(r"unknown parameter '([^']*)'", message)
    first = re.match(r"[a-z]+", message)
    field = unknown[1] if unknown else (first[0] if first and first[0] in (*curve_api.QUERY_PARAMS, "key", "format")
                                        else None)
    return error_response(message, code=400, fields={field: message} if field else {})


class RunMetrics(ApiView):
    request_serializers = {"POST": PointsSerializer}
    query_params = {"GET": [
        ("keys", "string", "comma-separated metric names (loss_0, full_acc_0, ...); empty: all"),
        ("split", "string", "train or val; empty: both"), ("start", "integer", "first step"),
        ("end", "integer", "last step"), ("points", "integer", "at most this many points per series (3..20000)")]}
    responses = {"GET": {"200": "{run, start, end, points, series: [{key, split, steps, values, ...}]}"},
                 "POST": {"200": "{accepted: points added, unchanged: steps stored already with that value, "
                                 "replaced: steps stored with another value, now this one}",
                          "409": "a pipeline run (its workers write its curves), or a run that has ended"}}

    def post(self, request, pk: int):
        """Report points of a run trained elsewhere: all stored, or none when one is bad (400 naming it).

        Idempotent by step: a batch sent again changes nothing, so a client retries freely."""
        return views_external.external_points_post(self, request, pk)

    def get(self, request, pk: int):
        """The run's curves over a step window, at most `points` points per series (spikes kept).

        The run page's own windowed read (runs.tracking.curve_api): ask again from a series'
        `last_step` + 1 to follow a live run, sending back the last answer's ETag (304 while no point arrived)."""
        return _curve_answer(curve_api.run_metrics(request._request, pk))  # 404 outside the caller's projects


class RunMetricsExport(ApiView):
    query_params = {"GET": [("key", "string", "one metric name"), ("split", "string", "train or val"),
                            ("format", "string", "csv (default) or json")]}
    responses = {"GET": {"200": "every point of one series, as CSV (step,epoch,value,time) or JSON"}}

    def get(self, request, pk: int):
        """One series at full resolution, streamed (the run page's export)."""
        return _curve_answer(curve_api.run_metrics_export(request._request, pk))  # 404 outside the caller's projects
