"""JSON endpoints the pages poll. Same rules as views: parse, call a selector, answer.

Every parameter is checked here; a bad one is a 400 with {"error": "..."} naming it, never a 500."""
from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from runs.fleet import selectors as fleet_selectors
from runs.pipeline import changes, selectors
from runs.pipeline.stage_record import StageStatus
from runs.data.paths import check_under_data_roots
from runs.web import live
from workers.contract.errors import InputError
from workers.contract.target import default_layer_ids, read_target_config, target_weight_bytes


MAX_ID = 2**63 - 1  # ids are 64-bit columns


def _bad(exc: InputError) -> JsonResponse:
    return JsonResponse({"error": str(exc)}, status=400)


def run_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The run's summary, which its page polls: 304 while its change counter stands still (one query),
    else the summary cached for every viewer until the counter moves (runs.web.live)."""
    if pk > MAX_ID:
        return JsonResponse({"error": f"no run {pk}"}, status=404)
    counters = changes.run_counters(run_id=pk)  # first: the rows read after it are at least this new
    if counters is None:
        raise Http404(f"no run {pk}")
    tag = live.etag("status", pk, counters.changes)
    if unchanged := live.not_modified(request, tag):
        return unchanged

    def build():
        summary = selectors.run_summary(selectors.run_get(pk=pk))
        running = any(stage["status"] == StageStatus.RUNNING for stage in summary["stages"])
        return live.json_bytes(summary), live.RUNNING_SECONDS if running else live.SETTLED_SECONDS

    return live.json_answer(tag=tag, body=live.cached(("status", pk, counters.changes), build))


def worker_list(request: HttpRequest) -> JsonResponse:
    """The fleet: workers, what a launch can ask of them now, and the queue (the workers page's facts)."""
    return JsonResponse(fleet_selectors.fleet_summary())


def target_inspect(request: HttpRequest) -> JsonResponse:
    """What the launch form needs to prefill layer ids for a typed target path, and the size of its
    weights (None without weight files), which a GPU backend's workers must hold."""
    try:
        path = check_under_data_roots(request.GET.get("path", ""), kind="target directory")
        if not path.is_dir():
            raise InputError(f"target directory {path} is not a directory")
        cfg = read_target_config(path)
        layers = default_layer_ids(cfg.num_layers)
    except InputError as exc:
        return _bad(exc)
    return JsonResponse({**cfg.as_dict(), "path": str(path), "default_layer_ids": layers,
                         "weight_bytes": target_weight_bytes(path)})
