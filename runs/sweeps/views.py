"""The sweeps list, a sweep's page (which polls /api/v1/sweeps/<id>/), and cancelling a sweep. Thin: a selector or a
service, then render."""
from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from runs.roles import user_can
from runs.sweeps import selectors, services
from runs.sweeps.spec import FLOAT_KEYS, INT_KEYS


def sweep_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.sweep_list(user=request.user), 50).get_page(request.GET.get("page"))
    return render(request, "runs/sweeps/sweep_list.html", {"page": page, "sweeps": page.object_list})


def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = selectors.sweep_get(pk=pk, user=request.user)  # 404 outside the user's projects
    rows, best = selectors.sweep_rows(sweep=sweep, user=request.user)
    summary = selectors.sweep_summary(sweep=sweep, rows=(rows, best))
    return render(request, "runs/sweeps/sweep_detail.html", {
        "sweep": sweep, "rows": rows, "best": best, "keys": sweep.keys,
        # The chart places numbers on a number axis; other settings (layers, datasets, backends) by name.
        "numeric_keys": [k for k in sweep.keys if k in INT_KEYS or k in FLOAT_KEYS],
        "summary": summary,
        "again_url": selectors.best_again_url(run_id=best.row.run.pk) if best.row else None,
        "compare": selectors.compare_link(rows),
        "can_cancel": user_can(request.user, "cancel") and not best.finished})


@require_POST
def sweep_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = selectors.sweep_get(pk=pk, user=request.user)  # 404 outside the user's projects
    count = services.sweep_cancel(sweep=sweep, user=request.user)
    messages.info(request, f"Cancelled {count} unfinished stage(s) of the runs of {sweep} you see.")
    return redirect(sweep)
