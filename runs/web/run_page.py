"""The run page's context in a fixed, small number of queries, most of it shared by every viewer.

What only the run's own writes change (its stages, summary, checkpoints, attempts, settings) is built
once per change of its state counter (runs.pipeline.status.changes) and cached (runs.live): a training's
progress and points, which move every few seconds, do not build it again. The page's script brings those
up to date with its first poll, which asks for what moved since the state the page holds (its summary
comes in the page, so that poll is the small live part); a page read without the script shows progress
at most PAGE_RUNNING_SECONDS old. Each request then
reads its counter, the reviews and tags (not counted there), and what depends on the fleet (which
queued stage no live worker takes, a hand-over the broker refused): seven queries with the session's,
whatever the run holds. The page's body below its tags, the same for everyone, is rendered once per
change of those facts and kept too; what is the viewer's own (forms and their CSRF tokens, the name in
the navigation, messages, the tags and reviews) is rendered for each request around it."""
from __future__ import annotations

import json

from django.db.models import prefetch_related_objects
from django.http import Http404
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from runs.fleet import selectors as fleet_selectors
from runs.pipeline.status import changes
from runs.pipeline.dispatch import queue
from runs.pipeline import selectors
from runs.pipeline.status.run_status import run_stages
from runs.pipeline.status.run_summary import run_summary, stage_warnings
from runs.pipeline.lifecycle.failure_selectors import run_failure
from runs.pipeline.launch.setting_bounds import HELD_OUT
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.tracking import comparison
from runs import live


# How long a running run's page is kept: its progress, durations and latest figures are as old as this
# at most where no script updates them (the page's first poll does).
PAGE_RUNNING_SECONDS = 60


def _shared(*, run_id: int, state_version: int) -> tuple[dict, int]:
    run = selectors.run_get(pk=run_id)
    prefetch_related_objects([run], "attempts")  # the summary's and the page's
    # Read once for the page and its summary (each read them, and their measurements and serve checks).
    checkpoints = selectors.run_checkpoints(run)
    # As the status poll answers it (runs.api.views.runs.RunStatus): the page's script starts from it.
    summary = {**run_summary(run, checkpoints=checkpoints), "state_version": state_version}
    extraction = selectors.run_extraction(run)
    manifest = getattr(extraction, "manifest", None)
    running = any(record.status == StageStatus.RUNNING for _, _, record in run_stages(run))
    by_suite = {row["id"]: row["tau_by_suite"] for row in summary["checkpoints"]}
    for checkpoint in checkpoints:  # its τ on the run's evaluation suites, beside the held-out τ
        checkpoint.tau_by_suite = {k: v for k, v in by_suite.get(checkpoint.pk, {}).items() if k != HELD_OUT}
    return {
        "run": run,
        "summary": summary,
        "extraction": extraction,
        "stages": [(name, label, record, stage_warnings(name, record))
                   for name, label, record in run_stages(run)],
        "status": summary["status"],
        "failure": run_failure(run_stages(run)),
        "layers": selectors.target_layers(target=run.target, layer_ids=summary["extraction"]["layer_ids"])
        if run.target_id and not run.external else [],
        "manifest_json": json.dumps(manifest.data, indent=2) if manifest else None,
        "checkpoints": checkpoints,
        "attempts": list(run.attempts.all()),
        "settings": sorted(comparison.run_settings(run).items()),
    }, PAGE_RUNNING_SECONDS if running else live.SETTLED_SECONDS


def run_page_context(*, run_id: int) -> dict:
    """Everything run_detail.html reads; Http404 when there is no such run."""
    counters = changes.run_counters(run_id=run_id)  # first: the rows read after it are at least this new
    if counters is None:
        raise Http404(f"no run {run_id}")
    context = live.cached(("run_page", run_id, counters.state_changes),
                          lambda: _shared(run_id=run_id, state_version=counters.state_changes))
    run = context["run"]  # a copy of its own (the cache stores pickles), so this request may add to it
    selectors.reviews_read([run])
    prefetch_related_objects([run], "tags")
    notes = fleet_selectors.stage_queue_notes(run=run)  # queued stages no live worker takes
    context = {**context, "stages": [(*stage, notes.get(stage[0])) for stage in context["stages"]],
               "waiting_for_queue": queue.run_waiting_for_queue(run_id=run_id)}
    return {**context, "body": _body(context, run_id=run_id, counter=counters.state_changes)}


def _body(context: dict, *, run_id: int, counter: int) -> SafeString:
    """The page below its tags (templates/runs/pipeline/_run_body.html), rendered once for every viewer while
    neither the run's state counter nor what the fleet says about it moved. It is rendered without the
    request: nothing in it can be one viewer's (no form, no CSRF token, no name, no message)."""
    waiting = context["waiting_for_queue"]
    key = ("run_page_body", run_id, counter, [(stage[0], stage[4]) for stage in context["stages"]],
           waiting and (waiting.pk, waiting.attempts, waiting.last_error))
    running = any(record.status == StageStatus.RUNNING for _, _, record, *_ in context["stages"])

    def build():
        return render_to_string("runs/pipeline/_run_body.html", context), PAGE_RUNNING_SECONDS if running else live.SETTLED_SECONDS

    return mark_safe(live.cached(key, build))  # noqa: S308 - rendered here by the template engine, escaped
