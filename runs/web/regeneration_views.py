"""The dataset page's Regenerate form and the buttons of its regenerations (cancel, retry)."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from runs.data import regeneration, regeneration_selectors
from runs.data import selectors as data_selectors
from runs.roles import require
from runs.web.forms import RegenerateForm
from workers.contract.errors import InputError


@require_POST
def dataset_regenerate(request: HttpRequest, pk: int) -> HttpResponse:
    from runs.web.views import dataset_detail

    require(request.user, "launch")  # before the form: a viewer is told the role to ask for, whatever they sent
    dataset = data_selectors.dataset_get(pk=pk, user=request.user)
    form = RegenerateForm(request.POST)
    if form.is_valid():
        try:
            job, queued = regeneration.dataset_regenerate_request(
                dataset=dataset, target=form.cleaned_data["target"], settings=form.regeneration_settings(),
                user=request.user)
        except InputError as exc:
            field = getattr(exc, "field", None)
            form.add_error(field if field in form.fields else None, str(exc))
        else:
            if queued:
                messages.success(request, f"Regeneration {job.pk} queued ({job.backend}): the target answers every "
                                          "user turn again; this page shows its progress and, once done, its dataset.")
            elif job.dataset_id:
                messages.info(request, f"These settings made {job.dataset.name} already (regeneration {job.pk}); "
                                       "nothing was queued.")
            else:
                messages.info(request, f"Regeneration {job.pk} with these settings is already {job.status}.")
            return redirect(dataset)
    messages.error(request, "The regeneration was not queued: " + "; ".join(
        f"{name}: {' '.join(errs)}" if name != "__all__" else " ".join(errs) for name, errs in form.errors.items()))
    response = dataset_detail(request, pk, regenerate_form=form)
    response.status_code = 400
    return response


@require_POST
def regeneration_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = regeneration_selectors.regeneration_get(pk=pk, user=request.user)
    if regeneration.regeneration_cancel(job=job, user=request.user):
        messages.info(request, f"Regeneration {job.pk} cancelled; the conversations it wrote are kept, and Retry "
                               "resumes from them.")
    else:
        messages.info(request, f"Regeneration {job.pk} had already finished ({job.status}).")
    return redirect(job.source or "runs:dataset_list")


@require_POST
def regeneration_retry(request: HttpRequest, pk: int) -> HttpResponse:
    job = regeneration_selectors.regeneration_get(pk=pk, user=request.user)
    try:
        retried = regeneration.regeneration_retry(job=job, user=request.user)
    except InputError as exc:  # a failure a retry cannot mend: nothing changed
        messages.error(request, str(exc))
        return redirect(job.source or "runs:dataset_list")
    if retried:
        messages.success(request, f"Regeneration {job.pk} queued again; it resumes after the conversations it wrote.")
    else:
        messages.info(request, f"Regeneration {job.pk} is {job.status}: only a failed or cancelled one is retried.")
    return redirect(job.source or "runs:dataset_list")
