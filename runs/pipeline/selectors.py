"""Reads for pages, the API and the CLI: runs, their checkpoints, the launch form's copy of a run. A run's status
is read in runs.pipeline.status.run_status, its summary in runs.pipeline.status.run_summary."""
from __future__ import annotations

from django.db.models import Prefetch, QuerySet, prefetch_related_objects
from django.shortcuts import get_object_or_404

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.data.models import Extraction
from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.checkpoints.serve_check_selectors import with_usability
from runs.pipeline.status.upstream_commands import with_serve_commands
from runs.pipeline.lifecycle.stages import STAGES
from runs.projects import access


def run_list() -> QuerySet[PipelineRun]:
    return PipelineRun.objects.select_related(
        "owner", "target", "dataset", "project", "preparation", "extract_stage__extraction__manifest", "vocab_mapping",
        "training_run", "evaluation", "sweep_entry__sweep"  # run_status: held by its sweep
    )


def run_get(*, pk: int, stages: bool = True, reviews: bool = False, user=None) -> PipelineRun:
    """One run, with its stages joined unless `stages` is False (and its reviews when asked); 404 when
    there is none, or when `user` is given and the run's project is not one they see (runs.projects.access)."""
    runs = run_list() if stages else PipelineRun.objects.all()
    runs = with_reviews(runs) if reviews else runs
    if user is not None:
        return access.visible_or_404("run", pk, user, rows=runs)
    return get_object_or_404(runs, pk=pk)


def run_visible_check(*, pk: int, user) -> None:
    """Http404 unless the run exists in a project the user sees (one small query), in the words of one
    that does not exist (runs.projects.access.visible_or_404)."""
    access.visible_or_404("run", pk, user, rows=PipelineRun.objects.only("pk"))


def run_extraction(run: PipelineRun) -> Extraction | None:
    """The hidden states the run's extract stage wrote; None until it succeeded (and for a run trained elsewhere)."""
    return None if run.external else getattr(run.extract_stage, "extraction", None)


def run_rows() -> QuerySet[PipelineRun]:
    """What the runs list shows of each run and run_status() reads: the run with its owner, target and
    dataset in one query, each stage's status in one query per stage. Logs, configs and histograms stay
    in the database. One query joining the five stage tables (run_list()) spent longer in PostgreSQL's
    planner than these six queries take together (measured: 18-28 ms against 13-20 ms for 50 runs)."""
    # prepare's start: a running run's duration, which the list counts on from it (static/js/runs/run_list.js).
    shown = {"prepare": ["started_at"], "extract": ["layer_ids"], "train": ["epochs", "best_epoch", "best_tau", "started_at"],
             "evaluate": ["tau"]}
    stages = [Prefetch(stage.related_name, queryset=stage.model.objects.only(
        "run_id", "status", *shown.get(stage.name, []))) for stage in STAGES]
    # The sweep entry and its sweep's `parallel`: whether (and why) its sweep holds the run back (run_status).
    return (PipelineRun.objects.select_related("owner", "target", "dataset", "project", "sweep_entry__sweep")
            .only("name", "external", "archived", "created_at", "owner__username", "target__name", "dataset__name",
                  "project__name", "sweep_entry__released_at", "sweep_entry__sweep__parallel")
            .prefetch_related(*stages))


def _reviews_of(model) -> Prefetch:
    # The subject's reverse relation to its reviews (runs.review.models.Review declares it, pointing down
    # here): the review model read from it, so the pipeline need not import the review domain above it.
    reviews = model._meta.get_field("reviews").related_model
    return Prefetch("reviews", queryset=reviews.objects.select_related("author"))


def reviews_read(subjects: list) -> None:
    """Read these subjects' reviews and each review's author, in one query (a run page's from the cache)."""
    if subjects:
        prefetch_related_objects(subjects, _reviews_of(type(subjects[0])))


def with_reviews(queryset: QuerySet) -> QuerySet:
    """Subjects with their reviews and each review's author: the review section of a page in one query,
    not one per review."""
    return queryset.prefetch_related(_reviews_of(queryset.model))


def checkpoints_with_tau(queryset: QuerySet[Checkpoint]) -> QuerySet[Checkpoint]:
    """Checkpoints with `measured` = their succeeded evaluations, newest first."""
    done = Evaluation.objects.filter(status=StageStatus.SUCCEEDED).order_by("-id")
    return queryset.prefetch_related(Prefetch("evaluations", queryset=done, to_attr="measured"))


def run_checkpoints(run: PipelineRun) -> list[Checkpoint]:
    """The training's checkpoints with their measurements, serve commands and whether each can serve."""
    return with_usability(with_serve_commands(checkpoints_with_tau(run.training_run.checkpoints.all()),
                                              verifier=run.target.path if run.target_id else ""))


def checkpoint_best(run: PipelineRun) -> Checkpoint | None:
    return Checkpoint.objects.filter(training_run__run=run, is_best=True).first()


def target_layers(*, target, layer_ids: list[int]) -> list[dict]:
    """Each hidden-state index of the target, marked when captured or an EAGLE-3 default."""
    captured, default = set(layer_ids), set(target.default_layer_ids)
    return [
        {
            "index": i,
            "captured": i in captured,
            "default": i in default,
            "label": "embeddings" if i == 0 else ("final" if i == target.num_layers else f"layer {i}"),
        }
        for i in range(target.num_layers + 1)
    ]


def checkpoint_get(*, pk: int, reviews: bool = False) -> Checkpoint:
    """One checkpoint with its run and target (and reviews when asked); 404 when none."""
    checkpoints = Checkpoint.objects.select_related("training_run__run__target", "imported_by")
    return get_object_or_404(with_reviews(checkpoints) if reviews else checkpoints, pk=pk)


def launch_copy_initial(*, run_id: str, user) -> dict | None:
    """The launch form's values for "launch a copy" of a run: its paths and every setting it ran with.
    None when there is no such run, or none the user sees (the same answer: runs.projects.access)."""
    if not (run_id.isascii() and run_id.isdigit()) or len(run_id) > 18:
        return None
    runs = access.visible("run", PipelineRun.objects.select_related("target", "dataset"), user)
    run = runs.filter(pk=int(run_id)).first()
    if run is None or run.external:  # a run trained elsewhere has no launch settings of ours to copy
        return None
    config = dict(run.config or {})
    initial = {key: value for key, value in config.items() if value is not None}
    initial["layer_ids"] = ", ".join(str(i) for i in config.get("layer_ids") or [])
    initial["capture_urls"] = "\n".join(config.get("capture_urls") or [])
    if config.get("serve_concurrency"):
        initial["serve_concurrency"] = ", ".join(str(c) for c in config["serve_concurrency"])
    initial.update(name=f"copy of {run}"[:200], target_path=run.target.path, dataset_path=run.dataset.path)
    return initial
