"""The checkpoint's buttons that ask for work on it: "Check with vLLM" (a serve check,
runs.checkpoints.serve_check_services) and "Export" (runs.checkpoints.export)."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from runs.pipeline import selectors
from runs.projects import selectors as project_selectors
from runs.checkpoints.export import checkpoint_export
from runs.checkpoints.serve_check_services import serve_check_request
from workers.contract.errors import InputError


@require_POST
def checkpoint_serve_check(request: HttpRequest, pk: int) -> HttpResponse:
    project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the user's projects
    checkpoint = selectors.checkpoint_get(pk=pk)
    try:
        check, created = serve_check_request(checkpoint=checkpoint, user=request.user)
    except InputError as exc:
        messages.error(request, str(exc))
    else:
        if created:
            messages.success(request, f"Serve check {check.pk} queued on vllm.{check.tensor_parallel_size}: a worker with vLLM serves the target with the "
                                      f"draft and alone, on the prompts evaluation {check.evaluation_id} measured our τ on "
                                      f"({check.evaluation.num_prompts or 'all'} of them).")
        else:
            messages.info(request, f"Serve check {check.pk} of this measurement is already {check.status}; its result "
                                   "appears here when it finishes, so no second one was queued.")
    return redirect(checkpoint)


@require_POST
def checkpoint_export_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The "Export" button: a new folder with the served files and the model card (runs.checkpoints.export)."""
    project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the user's projects
    checkpoint = selectors.checkpoint_get(pk=pk)
    try:
        exported = checkpoint_export(checkpoint=checkpoint, user=request.user,
                                     out_dir=request.POST.get("out_dir", "").strip() or None)
    except InputError as exc:
        messages.error(request, f"Not exported: {exc}")
    else:
        messages.success(request, f"Exported to {exported.path} ({', '.join(exported.files)}); its README.md is the "
                                  f"model card. Serve it with: {exported.card['serve_command']}")
    return redirect(request.POST.get("next") if request.POST.get("next", "").startswith("/runs/") else checkpoint)
