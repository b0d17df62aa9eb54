"""Server-rendered pages. Thin: parse input, call a service or selector, render."""
from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from runs.checkpoints import evaluation as evaluation_services
from runs.checkpoints import generation_selectors, k_selectors, serve_check_selectors
from runs.checkpoints.evaluation import EvaluationRequestError
from runs.data import extractions as extraction_services
from runs.data.demo import demo_build_failed, demo_build_progress, demo_build_unfinished, demo_paths
from runs.data import regeneration_selectors
from runs.data import selectors as data_selectors
from runs.data.regeneration_selectors import dataset_options
from runs.fleet import selectors as fleet_selectors
from runs.fleet import work_selectors
from runs.pipeline.lifecycle.failure_selectors import failure_of, run_failure_by_id
from runs.pipeline.jobs import selectors as job_selectors, services as job_services
from runs.pipeline.dispatch import queue
from runs.pipeline import selectors, services
from runs.pipeline.status import upstream_commands
from runs.projects import selectors as project_selectors
from runs.review import reviews
from runs.sweeps import selectors as sweep_selectors, services as sweep_services
from runs.review import tags as tag_services
from runs.roles import require, user_can
from runs.saved_views import page as run_list_page
from runs.tracking import comparison
from runs.web import run_page
from runs.web.forms import LaunchForm, RegenerateForm
from workers.contract.errors import InputError
from workers.contract.inputs.regular_file import open_regular


def run_list(request: HttpRequest) -> HttpResponse:
    """The runs list, filtered, sorted and paged by its query or by a saved view (`?view=<id>`)."""
    return run_list_page.run_list_response(request)


def run_launch(request: HttpRequest) -> HttpResponse:
    # A form its user may not submit is refused up front, with the role to ask for (403.html).
    require(request.user, "launch")
    # What the live workers can run (and why not), and the projects one may launch into: the select shows
    # where the run goes, Default (where a launch naming none goes) unless another is chosen.
    form_kwargs = {"options": fleet_selectors.launch_options(),
                   **project_selectors.launch_project_choices(user=request.user)}
    change = {}  # "copy with changes": the field to change (_copy_change)
    if request.method == "POST":
        form = LaunchForm(request.POST, **form_kwargs)
        if form.is_valid():
            try:
                launched = _launch_from(request, form)
            except InputError as exc:
                field = getattr(exc, "field", None)
                # A sweep's refusal in the form's words (SweepError.in_form), not the command line's (--vary).
                for message in getattr(exc, "in_form", None) or [str(exc)]:
                    form.add_error(field if field in form.fields else None, message)
            else:
                return launched
    elif request.GET.get("copy"):
        # "Launch the best again with more data" (a sweep's page): the copy asks for more conversations.
        found = (sweep_selectors.more_data_initial(run_id=request.GET["copy"], user=request.user)
                 if request.GET.get("more_data")
                 else (selectors.launch_copy_initial(run_id=request.GET["copy"], user=request.user), None))
        if found is None or found[0] is None:
            messages.error(request, f"There is no run {request.GET['copy'][:20]!r} to copy.")
            return redirect("runs:run_launch")
        initial, note = found
        if note:
            messages.info(request, note)
        form = LaunchForm(initial=initial, **form_kwargs)
        change = _copy_change(request, form)
    else:
        initial = dict(demo_paths())
        if initial:
            target = data_selectors.target_by_path(initial["target_path"])
            if target:
                initial["layer_ids"] = ", ".join(str(i) for i in target.default_layer_ids)
        form = LaunchForm(initial=initial, **form_kwargs)
    targets = data_selectors.target_list()[:100]
    datasets = dataset_options()  # each brought file followed by what was regenerated from it
    # A refused launch is the user's to fix: 400, with the form and its messages.
    status = 400 if request.method == "POST" else 200
    building = demo_build_unfinished()  # `make demo`'s target, while a worker builds it
    failed = None if building else demo_build_failed()  # or why its build stopped, with a button to build it again
    return render(request, "runs/pipeline/run_launch.html", {"form": form, "targets": targets, "datasets": datasets,
                                                    "demo_build": building and demo_build_progress(building),
                                                    "demo_failed": failed and failure_of(failed),
                                                    **change},
                  status=status)


def _copy_change(request: HttpRequest, form: LaunchForm) -> dict:
    """"Copy with changes" of a failed run (?copy=<id>&change=<field>): the field its failure blames,
    marked on the form with the failure's sentence, its fold opened."""
    field = request.GET.get("change", "")
    if field not in form.fields:
        return {}
    failure = run_failure_by_id(run_id=int(request.GET["copy"]))
    return {"change_field": field, "change_why": failure.sentence if failure else "",
            "change_advanced": field in form.ADVANCED}


def _launch_from(request: HttpRequest, form: LaunchForm) -> HttpResponse:
    """Launch the valid form's run, or its sweep when it varies settings; the page to go to."""
    data = form.cleaned_data
    if data["vary"]:
        sweep = sweep_services.sweep_launch(
            user=request.user, target_path=data["target_path"], dataset_path=data["dataset_path"],
            config=form.run_config(), varied=data["vary"], mode=data["sweep_mode"], name=data["name"],
            parallel=data["parallel"], project=data["project"])
        count = len(sweep_selectors.sweep_summary(sweep=sweep)["run_ids"])
        messages.success(request, f"Launched {sweep}: {count} runs, {sweep.parallel} at a time in the queues; each "
                                  "of the others follows when an earlier one finishes.")
        return redirect(sweep)
    run = services.run_launch(user=request.user, target_path=data["target_path"], dataset_path=data["dataset_path"],
                              config=form.run_config(), name=data["name"], project=data["project"], notes=data["notes"])
    if queue.run_waiting_for_queue(run_id=run.pk):
        # The broker refused the hand-over: the outbox keeps it and the workers retry.
        messages.warning(request, f"Launched {run}; it is waiting for the queue (Redis is not "
                                  "answering) and starts by itself once the queue is back.")
    else:
        messages.success(request, f"Launched {run}: the stages are queued.")
    return redirect(run)


def worker_list(request: HttpRequest) -> HttpResponse:
    """The fleet: each worker busy (with what), idle or offline, what its host can run, and the
    work queued for the workers in order."""
    return render(request, "runs/fleet/worker_list.html", {
        "rows": work_selectors.worker_rows(request.user), "queue": work_selectors.queued_work(request.user),
        "options": fleet_selectors.launch_options(), "offline_after": fleet_selectors.offline_after()})


def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    selectors.run_visible_check(pk=pk, user=request.user)  # 404 outside the user's projects
    return render(request, "runs/pipeline/run_detail.html", run_page.run_page_context(run_id=pk))


@require_POST
def run_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    run = selectors.run_get(pk=pk, stages=False, user=request.user)
    count = services.run_cancel(run=run, user=request.user)
    messages.info(request, f"Cancelled {count} unfinished stage(s) of {run}.")
    return redirect(run)


@require_POST
def run_tags(request: HttpRequest, pk: int) -> HttpResponse:
    run = selectors.run_get(pk=pk, stages=False, user=request.user)
    try:
        names = tag_services.run_tags_set(run=run, text=request.POST.get("tags", ""), user=request.user)
    except InputError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Tags of {run}: {', '.join(names) or 'none'}.")
    return redirect(run)


def dataset_detail(request: HttpRequest, pk: int, regenerate_form=None) -> HttpResponse:
    dataset = data_selectors.dataset_get(pk=pk, user=request.user)
    preparations = data_selectors.dataset_preparations(dataset, user=request.user)
    sample_count, excluded_count = job_selectors.dataset_sample_counts(dataset=dataset)
    catalogues = job_selectors.dataset_catalogues(dataset=dataset)
    latest = next((p.length_histogram for p in preparations if p.length_histogram.get("counts")), None)
    return render(
        request,
        "runs/data/dataset_detail.html",
        {
            "dataset": dataset,
            "preparations": preparations,
            "latest_histogram": latest,
            "sample_count": sample_count,
            "excluded_count": excluded_count,
            "catalogues": catalogues,
            # Lineage: what it was made from, what was made from it, and the form to make more.
            "made_by": regeneration_selectors.dataset_made_by(dataset=dataset),
            "regenerations": regeneration_selectors.dataset_regenerations(dataset=dataset),
            "regenerate_form": regenerate_form or RegenerateForm(),
        },
    )


@require_POST
def dataset_catalogue(request: HttpRequest, pk: int) -> HttpResponse:
    dataset = data_selectors.dataset_get(pk=pk, user=request.user)
    catalogue = job_services.dataset_catalogue_request(dataset=dataset, user=request.user)
    messages.info(request, f"Cataloguing {dataset.name} on a worker (#{catalogue.pk}); this page shows its progress.")
    return redirect(dataset)


def extraction_detail(request: HttpRequest, pk: int) -> HttpResponse:
    extraction = data_selectors.extraction_get(pk=pk, user=request.user, reviews=True)
    manifest = getattr(extraction, "manifest", None)
    layers = selectors.target_layers(target=extraction.target, layer_ids=extraction.layer_ids)
    requests = job_selectors.extraction_verification_requests(extraction=extraction)
    return render(
        request,
        "runs/data/extraction_detail.html",
        {
            "extraction": extraction,
            "layers": layers,
            "forecast": data_selectors.extraction_forecast(extraction),
            "histogram": (extraction.latest_verification.report.get("length_histogram")
                          if extraction.latest_verification else None),
            "manifest_json": json.dumps(manifest.data, indent=2) if manifest else None,
            "verification_requests": requests,
            "verifying": any(shown.active for shown in requests),
        },
    )


def extraction_list(request: HttpRequest) -> HttpResponse:
    extractions = list(data_selectors.extraction_list_verified(user=request.user)[:200])
    states = reviews.review_states(subjects=extractions)
    rows = [(e, states.get(e.pk)) for e in extractions]
    return render(request, "runs/data/extraction_list.html", {"rows": rows})


DATASETS_PER_PAGE = 100


def dataset_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(data_selectors.dataset_list(), DATASETS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "runs/data/dataset_list.html", {"datasets": page.object_list, "page": page})


@require_POST
def review_create(request: HttpRequest, subject: str, pk: int) -> HttpResponse:
    obj = reviews.review_subject_get(subject=subject, pk=pk, user=request.user)
    try:
        reviews.review_add(user=request.user, subject=obj, decision=request.POST.get("decision", "comment"),
                           text=request.POST.get("text", ""))
    except InputError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Review recorded.")
    return redirect(obj)


def extraction_import(request: HttpRequest) -> HttpResponse:
    """Register an extraction made elsewhere (any of the three layouts); a worker verifies its headers."""
    require(request.user, "import")
    error = None
    if request.method == "POST":
        try:
            extraction, created = extraction_services.extraction_import(
                path=request.POST.get("path", ""), target_path=request.POST.get("target_path") or None,
                user=request.user, verify_on_worker=True,
            )
        except InputError as exc:
            error = str(exc)
        else:
            verb = "Imported" if created else "Already imported:"
            messages.success(request, f"{verb} extraction {extraction.pk} ({extraction.layout}).")
            return redirect(extraction)
    return render(request, "runs/data/extraction_import.html", {"error": error, "values": request.POST},
                  status=400 if error else 200)


@require_POST
def extraction_reverify(request: HttpRequest, pk: int) -> HttpResponse:
    """Verification of a large extraction takes minutes: a worker does it, the page shows how far."""
    extraction = data_selectors.extraction_get(pk=pk, user=request.user)
    full = request.POST.get("full") == "on"
    job = job_services.extraction_verify_request(extraction=extraction, full=full, user=request.user)
    messages.info(request, f"Verification #{job.pk} ({'every value' if full else 'headers'}) runs on a worker; "
                           "this page shows its progress.")
    return redirect(extraction)


@require_POST
def run_retry(request: HttpRequest, pk: int) -> HttpResponse:
    run = selectors.run_get(pk=pk, stages=False, user=request.user)
    try:
        count = services.run_retry(run=run, user=request.user)
    except InputError as exc:  # no live worker takes what it would queue: said on the run page
        messages.error(request, str(exc))
    else:
        messages.info(request, f"Queued {count} stage(s) of {run} again." if count else "Nothing to retry.")
    return redirect(run)


@require_POST
def extraction_override(request: HttpRequest, pk: int) -> HttpResponse:
    extraction = data_selectors.extraction_get(pk=pk, user=request.user)
    try:
        extraction_services.verification_override(
            extraction=extraction, user=request.user, reason=request.POST.get("reason", "")
        )
    except InputError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Override recorded: training may use this extraction.")
    return redirect(extraction)


def _small_text(path: Path, limit: int = 1 << 20) -> str | None:
    """A regular file's first `limit` bytes as text (a FIFO or device there would hang the request)."""
    try:
        with open_regular(path) as fh:
            return fh.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def checkpoint_detail(request: HttpRequest, pk: int) -> HttpResponse:
    project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the user's projects
    checkpoint = selectors.checkpoint_get(pk=pk, reviews=True)
    config_path = Path(checkpoint.path) / "config.json"
    config = _small_text(config_path)
    evaluations = list(checkpoint.evaluations.select_related("requested_by")[:20])
    measured = next((e for e in evaluations if e.status == "succeeded"), None)
    serve_checks = serve_check_selectors.checkpoint_serve_checks(checkpoint)
    usable, unusable_why = serve_check_selectors.checkpoint_usable(checkpoint)
    return render(request, "runs/checkpoints/checkpoint_detail.html", {
        "serve_checks": serve_checks, "served": next((c for c in serve_checks if c.status == "succeeded"), None),
        "unusable_why": "" if usable else unusable_why,
        "checkpoint": checkpoint, "config_json": config, "evaluations": evaluations, "measured": measured,
        "serve_command": upstream_commands.checkpoint_serve_command(checkpoint),
        "acceptance_json": json.dumps(measured.acceptance_per_position) if measured else "[]",
        "k_rows": k_selectors.k_rows(measured), "k_beyond": settings.EAGLE3WEB_K_BEYOND_TRAINED,
        "evaluating": any(not e.is_finished for e in (*evaluations, *serve_checks)),
        "can_evaluate": user_can(request.user, "launch"),
        "generation_choices": generation_selectors.compare_choices(checkpoint=checkpoint, user=request.user),
    })


def _optional_int(value: str | None, name: str, default: int | None = None) -> int | None:
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise EvaluationRequestError(f"{name} must be a whole number, got {value!r}") from None


@require_POST
def checkpoint_evaluate(request: HttpRequest, pk: int) -> HttpResponse:
    """Measure a checkpoint's acceptance length on a GPU worker."""
    project_selectors.checkpoint_visible_check(pk=pk, user=request.user)  # 404 outside the user's projects
    checkpoint = selectors.checkpoint_get(pk=pk)
    try:
        evaluation, created = evaluation_services.evaluation_request(
            checkpoint=checkpoint, user=request.user,
            prompts_path=request.POST.get("prompts_path", "").strip() or None,
            max_new_tokens=_optional_int(request.POST.get("max_new_tokens"), "max new tokens", 64),
            max_prompts=_optional_int(request.POST.get("max_prompts"), "prompts", 32),
            num_speculative_tokens=_optional_int(request.POST.get("num_speculative_tokens"), "draft tokens per step"),
        )
    except InputError as exc:
        messages.error(request, str(exc))
    else:
        if created:
            messages.success(request, f"Evaluation {evaluation.pk} queued: a worker decodes the prompts with and "
                                      "without the draft.")
        else:
            messages.info(request, f"Evaluation {evaluation.pk} with these settings is already {evaluation.status}; "
                                   "its result appears here when it finishes, so no second one was queued.")
    return redirect(checkpoint)


def run_compare(request: HttpRequest) -> HttpResponse:
    """2 to 50 runs side by side: `?ids=3,5,8` (the runs list's checkboxes send ids=3&ids=5)."""
    try:
        run_ids = comparison.compare_ids(request.GET.getlist("ids"))
        try:
            baseline_id, refused = comparison.baseline_id_parse(request.GET.get("baseline")), None
        except comparison.ComparisonError as exc:  # a mistyped link's baseline: the runs still compare
            baseline_id, refused = None, str(exc)
        context = comparison.run_comparison(run_ids=run_ids, user=request.user, baseline_id=baseline_id)
    except comparison.ComparisonError as exc:
        return render(request, "runs/tracking/run_compare.html", {"error": str(exc)}, status=400)
    refused = refused or context["acceptance"]["refused"]  # or a saved link's whose measurement went since
    if refused:
        messages.warning(request, f"{refused}; the deltas are against the first measured run instead.")
    chart_runs = [{"id": r["run"].pk, "name": str(r["run"]), "url": reverse("api:run_metrics", args=[r["run"].pk]),
                   "tau": r["tau"], "acceptance_per_position": (  # a run trained elsewhere has no measurement of ours
                       None if r["run"].external else r["run"].evaluation.acceptance_per_position) or []}
                  for r in context["runs"]]
    return render(request, "runs/tracking/run_compare.html", {
        **context, "chart_runs": chart_runs,
        "acceptance_api": f"{reverse('api:compare_acceptance')}?ids={','.join(map(str, run_ids))}"})
