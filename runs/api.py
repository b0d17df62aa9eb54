"""JSON endpoints the pages poll. Same rules as views: parse, call a selector, answer."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404

from runs import selectors
from runs.models import PipelineRun
from runs.paths import check_under_data_roots
from workers.stages.errors import InputError
from workers.stages.target import default_layer_ids, read_target_config


def run_status(request: HttpRequest, pk: int) -> JsonResponse:
    run = get_object_or_404(selectors.run_list(), pk=pk)
    return JsonResponse(selectors.run_summary(run))


def run_metrics(request: HttpRequest, pk: int) -> JsonResponse:
    run = get_object_or_404(PipelineRun, pk=pk)
    try:
        after = int(request.GET.get("after", "0"))
    except ValueError:
        return JsonResponse({"error": "after must be an integer metric-point id"}, status=400)
    points = selectors.curve_points(run=run, after_id=after)
    return JsonResponse({"points": points, "last_id": points[-1]["id"] if points else after})


def target_inspect(request: HttpRequest) -> JsonResponse:
    """What the launch form needs to prefill layer ids for a typed target path."""
    try:
        path = check_under_data_roots(request.GET.get("path", ""), kind="target directory")
        cfg = read_target_config(path)
        layers = default_layer_ids(cfg.num_layers)
    except InputError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({**cfg.as_dict(), "path": str(path), "default_layer_ids": layers})
