"""JSON endpoints the pages poll. Same rules as views: parse, call a selector, answer.

Every parameter is checked here; a bad one is a 400 with {"error": "..."} naming it, never a 500."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from runs.fleet import selectors as fleet_selectors
from runs.pipeline import selectors
from runs.data.paths import check_under_data_roots
from workers.contract.errors import InputError
from workers.contract.target import default_layer_ids, read_target_config, target_weight_bytes


MAX_ID = 2**63 - 1  # ids are 64-bit columns


def _bad(exc: InputError) -> JsonResponse:
    return JsonResponse({"error": str(exc)}, status=400)


def run_status(request: HttpRequest, pk: int) -> JsonResponse:
    if pk > MAX_ID:
        return JsonResponse({"error": f"no run {pk}"}, status=404)
    run = selectors.run_get(pk=pk)
    return JsonResponse(selectors.run_summary(run))


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
