"""Rows as the API answers them: pure functions over what a selector loaded (its joins and prefetches),
no query of their own beyond those; and a whole run as every view that answers with one answers it
(runs.api.views.runs, views_external, idempotency), which reads it through the run's selector."""
from __future__ import annotations

from django.urls import reverse
from rest_framework.response import Response

from runs.api.base import created
from runs.pipeline.dispatch import queue
from runs.pipeline import selectors
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline.lifecycle.failure_selectors import failure_fields


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def _user(user) -> str | None:
    return user.get_username() if user else None


def api_url(request, name: str, *args) -> str:
    return request.build_absolute_uri(reverse(f"api:{name}", args=args))


def run_row(run, request) -> dict:
    """A row of the runs list (runs.tracking.runs_list.run_table.ListedRun): what the list's page shows of it."""
    duration = run.duration
    return {
        "id": run.pk, "name": str(run), "status": run.status,
        "status_reason": run.status_reason or None,  # "held: its sweep runs at most 2 at once"
        "owner": run.owner_name,
        "external": run.external, "target": run.target_name, "dataset": run.dataset_name,
        "created_at": _iso(run.created_at),
        "duration_seconds": round(duration.total_seconds(), 1) if duration is not None else None,
        "epochs": run.epochs, "best_epoch": run.best_epoch, "best_val_loss": run.best_val_loss, "tau": run.shown_tau,
        "tags": run.tags, "project": run.project_name, "archived": run.archived,
        "url": api_url(request, "run_detail", run.pk), "page_url": request.build_absolute_uri(run.get_absolute_url()),
    }


def job_dict(shown) -> dict:
    """A catalogue pass or a verification request (runs.pipeline.jobs.selectors.JobShown)."""
    job = shown.job
    return {"id": job.pk, "status": job.status, "queued_at": _iso(job.queued_at), "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at), "progress_done": job.progress_done,
            "progress_total": job.progress_total, "worker": job.worker, **failure_fields(job),
            "requested_by": _user(job.requested_by) if job.requested_by_id else None,
            "waiting_for_broker": shown.waiting_for_broker or None}


def evaluation_row(evaluation) -> dict:
    return {"id": evaluation.pk, "status": evaluation.status, "tau": evaluation.tau,
            "acceptance_per_position": evaluation.acceptance_per_position,
            "output_matches_greedy": evaluation.output_matches_greedy, "num_prompts": evaluation.num_prompts,
            "max_prompts": evaluation.max_prompts, "max_new_tokens": evaluation.max_new_tokens,
            "num_speculative_tokens": evaluation.num_speculative_tokens, "prompts_path": evaluation.prompts_path or None,
            "speedup": evaluation.speedup, "device": evaluation.device, **failure_fields(evaluation),
            "requested_by": _user(evaluation.requested_by) if evaluation.requested_by_id else None,
            "queued_at": _iso(evaluation.queued_at), "finished_at": _iso(evaluation.finished_at)}


def checkpoint_dict(checkpoint, request, *, evaluations, usable: bool, unusable_why: str, serve_command) -> dict:
    training = checkpoint.training_run
    return {
        "id": checkpoint.pk, "path": checkpoint.path, "epoch": checkpoint.epoch,
        "run": training.run_id if training else None,
        "run_url": api_url(request, "run_detail", training.run_id) if training else None,
        "imported_by": _user(checkpoint.imported_by) if checkpoint.imported_by_id else None,
        "imported_at": _iso(checkpoint.imported_at), "verifier_path": checkpoint.verifier_path or None,
        "train_loss": checkpoint.train_loss, "val_loss": checkpoint.val_loss, "val_metrics": checkpoint.val_metrics,
        "is_best": checkpoint.is_best, "simulated_tau": checkpoint.simulated_tau,
        "speculative_tokens": checkpoint.speculative_tokens, "draft_vocab_size": checkpoint.draft_vocab_size,
        "usable": usable, "unusable_why": unusable_why or None, "serve_command": serve_command,
        "evaluations": [evaluation_row(e) for e in evaluations],
        "page_url": request.build_absolute_uri(checkpoint.get_absolute_url()),
    }


def extraction_row(extraction, request) -> dict:
    return {
        "id": extraction.pk, "path": extraction.path, "layout": extraction.layout,
        "target": {"id": extraction.target_id, "name": extraction.target.name},
        "layer_ids": extraction.layer_ids, "num_samples": extraction.num_samples,
        "total_tokens": extraction.total_tokens, "dtype": extraction.dtype,
        "verified": getattr(extraction, "verified", None),
        "produced_by_run": extraction.produced_by.run_id if extraction.produced_by_id else None,
        "imported_by": _user(extraction.imported_by) if extraction.imported_by_id else None,
        "imported_at": _iso(extraction.imported_at), "created_at": _iso(extraction.created_at),
        "url": api_url(request, "extraction_detail", extraction.pk),
        "page_url": request.build_absolute_uri(extraction.get_absolute_url()),
    }


def dataset_row(dataset, request) -> dict:
    regeneration = getattr(dataset, "regeneration", None)
    return {
        "id": dataset.pk, "name": dataset.name, "path": dataset.path, "size_bytes": dataset.size_bytes,
        "created_at": _iso(dataset.created_at),
        "regenerated_from": regeneration.source_id if regeneration is not None else None,
        "url": api_url(request, "dataset_detail", dataset.pk),
        "page_url": request.build_absolute_uri(dataset.get_absolute_url()),
    }


def target_row(target) -> dict:
    return {"id": target.pk, "name": target.name, "path": target.path, "architecture": target.architecture,
            "num_layers": target.num_layers, "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "default_layer_ids": target.default_layer_ids}


def run_answer(pk: int, request) -> dict:
    """A run as GET /api/v1/runs/<id>/ answers it: the run summary (runs.pipeline.status.run_summary,
    as run_pipeline --json prints it) with its id, tags and where to find it."""
    run = selectors.run_get(pk=pk, user=request.user)  # 404 outside the user's projects
    return {"id": run.pk, **run_summary(run), "owner": run.owner.get_username(),
            "created_at": run.created_at.isoformat(), "tags": [tag.name for tag in run.tags.all()],
            "waiting_for_queue": _waiting(queue.run_waiting_for_queue(run_id=run.pk)),
            "url": api_url(request, "run_detail", run.pk),
            "page_url": request.build_absolute_uri(run.get_absolute_url())}


def _waiting(pending) -> dict | None:
    """The run's hand-over the broker refused, as JSON (null when none): the run is stored and the outbox
    (runs.pipeline.dispatch.queue) sends it once the broker answers, so a client needs no retry of its own."""
    if pending is None:
        return None
    return {"attempts": pending.attempts, "last_error": pending.last_error[:500],
            "since": pending.created_at.isoformat()}


def launched(run, request) -> Response:
    """201 with the run and its Location."""
    response = created(run_answer(run.pk, request))
    response["Location"] = api_url(request, "run_detail", run.pk)
    return response
