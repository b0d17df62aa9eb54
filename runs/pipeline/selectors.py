"""Reads for pages, the API and the CLI."""
from __future__ import annotations


from django.db.models import Prefetch, QuerySet, prefetch_related_objects
from django.shortcuts import get_object_or_404

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.data.models import Extraction
from runs.pipeline.models import ExtractStage, PipelineRun, Preparation, StageAttempt, VocabMapping
from runs.pipeline.lifecycle.stage_record import StageRecord, StageStatus
from runs.pipeline.nodes.selectors import training_nodes
from runs.fleet.selectors import run_backends
from runs.data.regeneration_selectors import regeneration_dict, run_data_policy
from runs.pipeline import best
from runs.pipeline.lifecycle.failure_selectors import failure_of, run_failure
from runs.pipeline.status.glance import run_glance
from runs.pipeline.online.selectors import is_online, online_note, supply_dict
from runs.checkpoints.serve_check_selectors import run_serve_check, serve_check_dict, with_usability
from runs.checkpoints.k_selectors import checkpoint_deploy_keys
from runs.pipeline.status.upstream_commands import run_speculators_train_command, with_serve_commands
from runs.pipeline.shards.selectors import run_shards
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
    # prepare's start: a running run's duration, which the list counts on from it (static/js/run_list.js).
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


def _count(value) -> str:
    return f"{value:,}"


def stage_warnings(name: str, record: StageRecord) -> list[str]:
    """What a stage dropped, cut or assumed, in words; shown beside the stage, not only in its log."""
    warnings = []
    if name == "prepare":
        if record.num_excluded:
            warnings.append(f"{_count(record.num_excluded)} conversation(s) excluded by curation")
        if record.num_turns_dropped:
            warnings.append(f"{_count(record.num_turns_dropped)} assistant turn(s) dropped: their context alone "
                            f"reaches max_seq_len={record.max_seq_len}, or the chat template renders them unstably")
        if record.num_truncated_rows:
            warnings.append(f"{_count(record.num_truncated_rows)} row(s) cut at max_seq_len={record.max_seq_len}: "
                            f"{_count(record.truncated_loss_tokens or 0)} supervised token(s) lost")
        if record.num_without_assistant:
            warnings.append(f"{_count(record.num_without_assistant)} conversation(s) gave no training row")
    elif name == "train":
        if getattr(record, "stopped_early", ""):
            warnings.append(record.stopped_early)
        if record.resumed_from_step:
            warnings.append(f"resumed from step {_count(record.resumed_from_step)} after a lost or cancelled attempt: "
                            "the curve and checkpoints before it are the earlier attempt's")
        available, trained = record.loss_tokens_available, record.loss_tokens_trained
        if available is not None and trained is not None and trained < available:
            warnings.append(f"{_count(available - trained)} of {_count(available)} supervised tokens of the train "
                            f"split never reached the loss in the last epoch")
        if record.rows_unusable:
            warnings.append(f"{_count(record.rows_unusable)} row(s) too short to train on")
        if record.split.get("by") == "row":
            warnings.append("validation split by row: the prepared rows carry no conversation ids, so validation "
                            "rows may share a conversation with training rows")
    elif name == "evaluate" and record.output_matches_greedy is False:
        warnings.append(f"the draft changed the decoded text on {len(record.mismatched_prompts)} prompt(s); "
                        "speculative decoding must equal greedy decoding")
    return warnings


EXTERNAL_TRAIN_LABEL = "Train draft (elsewhere)"


def run_stages(run: PipelineRun) -> list[tuple[str, str, StageRecord]]:
    """(name, label, row) of each stage the run has: the five of a pipeline run, the training alone of a run
    trained elsewhere (runs.pipeline.launch.external)."""
    if run.external:
        return [("train", EXTERNAL_TRAIN_LABEL, run.training_run)]
    return [(stage.name, stage.label, getattr(run, stage.related_name)) for stage in STAGES]


# The whole run's status from its stages': the first rule that holds (any stage, or every stage, has
# that status), else RUN_STATUS_OTHERWISE. run_table.with_columns writes the same rules in SQL.
RUN_STATUS_RULES = ((any, StageStatus.FAILED), (any, StageStatus.CANCELLED),
                    (all, StageStatus.SUCCEEDED), (all, StageStatus.QUEUED))
RUN_STATUS_OTHERWISE = StageStatus.RUNNING


# A run of a sweep that its sweep has not handed to the queues yet (runs.sweeps.release): every stage
# queued and its SweepRun's released_at null. A run status, not a stage's; run_table words it in SQL too.
RUN_HELD = "held"
RUN_STATUSES = [*(s.value for s in StageStatus), RUN_HELD]


def _sweep_entry(run: PipelineRun):
    """The run's SweepRun (and its sweep), or None: joined by run_list() and run_rows(), else one query."""
    try:
        return run.sweep_entry
    except PipelineRun.sweep_entry.RelatedObjectDoesNotExist:
        return None


def run_status(run: PipelineRun) -> str:
    """One word for the whole run, derived from its stages (and, for a sweep's run not yet handed to the
    queues, its sweep: RUN_HELD). The pages, the API and the CLI all read it from here."""
    statuses = [record.status for _, _, record in run_stages(run)]
    for quantifier, status in RUN_STATUS_RULES:
        if quantifier(s == status for s in statuses):
            if status == StageStatus.QUEUED and not run.external:
                entry = _sweep_entry(run)
                if entry is not None and entry.released_at is None:
                    return RUN_HELD
            return status
    return RUN_STATUS_OTHERWISE


def run_status_reason(run: PipelineRun, status: str | None = None) -> str:
    """Why the run waits, in words ("held: its sweep runs at most 2 at once"); "" when there is nothing to
    say. `status` when the caller has it already (run_status's)."""
    if (status or run_status(run)) != RUN_HELD:
        return ""
    return f"{RUN_HELD}: its sweep runs at most {_sweep_entry(run).sweep.parallel} at once"


def run_is_finished(run: PipelineRun) -> bool:
    return all(record.is_finished for _, _, record in run_stages(run))


def _stage_dict(name: str, label: str, record: StageRecord, shards: list[dict] | None = None) -> dict:
    entry = {
        "name": name,
        "label": label,
        "status": record.status,
        "started_at": record.started_at.isoformat() if record.started_at else None,
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "seconds": round(record.seconds, 2) if record.seconds is not None else None,
        "progress_done": record.progress_done,
        "progress_total": record.progress_total,
        "progress": round(record.progress_fraction, 4),
        "worker": record.worker,
        # A sentence naming what to change; the frames are "error_detail", never in "error" (workers.contract.failures).
        "error": record.headline, "error_detail": record.developer_details,
        "failure": failure.as_dict() if (failure := failure_of(record)) else None,
        "log_tail": record.log_shown,
        "out_dir": record.out_dir,
        "warnings": stage_warnings(name, record),
        # A stage split over many workers (runs.pipeline.shards.selectors); [] for one that ran whole.
        "shards": shards or [],
    }
    if name == "prepare":
        entry.update({key: getattr(record, key) for key in (
            "num_conversations", "num_rows", "num_excluded", "num_without_assistant", "num_turns_dropped",
            "num_truncated_rows", "truncated_loss_tokens", "loss_tokens", "mask_source")})
    elif name == "extract":
        entry.update({"device": record.device, "time_split_s": record.time_split_s})
        # An online run's stage extracts nothing (runs.pipeline.online.selectors); said beside the stage, not only in its log.
        entry["note"] = online_note(record.run.config) if is_online(record.run.config) else ""
    elif name == "train":
        entry.update({key: getattr(record, key) for key in (
            "loss_tokens_available", "loss_tokens_trained", "loss_tokens_per_epoch", "tokens_per_step",
            "rows_unusable", "split", "device", "resumed_from_step", "step_config", "time_split_s")})
    elif name == "evaluate":
        entry.update({"checkpoint_id": record.checkpoint_id, "device": record.device})
    return entry


def attempt_dict(attempt: StageAttempt) -> dict:
    return {
        "stage": attempt.stage,
        "number": attempt.number,
        "worker": attempt.worker,
        "started_at": attempt.started_at.isoformat(),
        "finished_at": attempt.finished_at.isoformat() if attempt.finished_at else None,
        "seconds": round(attempt.seconds, 2),
        "outcome": attempt.outcome,
        "error": attempt.headline,
        "log_tail": attempt.log_shown,
    }


def evaluation_dict(evaluation: Evaluation | None, simulated_tau: float | None = None) -> dict:
    fields = ("tau", "tau_standard_error", "acceptance_per_position", "output_matches_greedy", "mismatched_prompts", "num_prompts",
              "new_tokens", "verify_forwards", "num_speculative_tokens", "max_new_tokens", "spec_tokens_per_s",
              "greedy_tokens_per_s", "speedup", "device", "prompt_source", "checkpoint_id")
    values = {key: getattr(evaluation, key, None) for key in fields}
    return {"id": evaluation.pk if evaluation else None,
            "status": evaluation.status if evaluation else None, **values, "simulated_tau": simulated_tau}


def run_checkpoints(run: PipelineRun) -> list[Checkpoint]:
    """The training's checkpoints with their measurements, serve commands and whether each can serve."""
    return with_usability(with_serve_commands(checkpoints_with_tau(run.training_run.checkpoints.all()),
                                              verifier=run.target.path if run.target_id else ""))


def run_summary(run: PipelineRun, *, checkpoints: list[Checkpoint] | None = None) -> dict:
    """What the CLI prints and the run page polls: ids, stage states, totals, paths.

    `run` should come from run_list(), which joins every stage in one query. A run trained elsewhere has
    its training alone: the other stages' figures are None, as they are before a stage ran. `checkpoints`:
    the training's, as run_checkpoints reads them, where the caller shows them too (the run page), so that
    they, their measurements and serve checks are read once."""
    records = {name: record for name, _, record in run_stages(run)}
    training = records["train"]
    # Unsaved rows stand for the stages an external run does not have: every figure None, no id.
    prep, extract, vocab = (records.get("prepare") or Preparation(), records.get("extract") or ExtractStage(),
                            records.get("vocab") or VocabMapping())
    evaluation = records.get("evaluate")
    extraction = run_extraction(run)
    manifest = getattr(extraction, "manifest", None)
    if checkpoints is None:
        checkpoints = run_checkpoints(run)
    scores = best.checkpoint_scores(run=run, checkpoints=checkpoints)
    choice = best.best_choice(run=run, scores=scores)
    by_id = {score.checkpoint_id: score for score in scores}
    shown = best.best_measurement(evaluation, choice)
    evaluated = next((c for c in checkpoints if shown and c.pk == shown.checkpoint_id), None)
    policy = run_data_policy(run=run) if run.dataset_id and run.target_id else None
    shards = run_shards(run_id=run.pk)
    summary = {
        "run_id": run.pk,
        "name": str(run),
        "external": run.external,
        "status": run_status(run),
        "status_reason": run_status_reason(run) or None,
        # Whether a retry can succeed and why; None while no stage failed (runs.pipeline.lifecycle.failure_selectors).
        "failure": failure.as_dict() if (failure := run_failure(run_stages(run))) else None,
        "finished": run_is_finished(run),
        # The target is named by its config.json: a directory with weights in a summary reads as a
        # checkpoint to the reviewers' checker, and the only checkpoints here are the draft's.
        "target": {"id": run.target_id, "name": run.target.name,
                   "config_path": f"{run.target.path}/config.json", "num_layers": run.target.num_layers,
                   "hidden_size": run.target.hidden_size, "vocab_size": run.target.vocab_size}
        if run.target_id else None,
        "dataset": {"id": run.dataset_id, "path": run.dataset.path,
                    "on_policy": policy.on_policy if policy else None, "data_policy": policy.why if policy else None}
        if run.dataset_id else None,
        # The dataset's provenance when it was regenerated from another (None for a file a user brought).
        "regenerated_from": regeneration_dict(policy.regeneration) if policy and policy.regeneration else None,
        "config": run.config,
        "best_by": choice.by,
        "best": best.best_dict(choice),
        "backends": [] if run.external else run_backends(config=run.config),
        "output_dir": run.output_dir,
        "speculators_train_command": None if run.external else run_speculators_train_command(
            run=run, vocab=vocab, extraction=extraction),
        # "extraction" is the artifact (None until the extract stage succeeded), "extract_stage" its execution.
        "ids": {"preparation": prep.pk, "extract_stage": extract.pk,
                "extraction": extraction.pk if extraction else None, "vocab_mapping": vocab.pk,
                "training_run": training.pk, "evaluation": evaluation.pk if evaluation else None},
        "stages": [_stage_dict(name, label, record, shards.get(name)) for name, label, record in run_stages(run)],
        "tokens": {
            "conversations": prep.num_conversations,
            "rows": prep.num_rows,
            "total_tokens": prep.total_tokens,
            "loss_tokens": prep.loss_tokens,
            "length_histogram": prep.length_histogram,
            "extracted_tokens": extraction.total_tokens if extraction else None,
            "vocab_coverage": vocab.coverage,
            "train_tokens": training.train_tokens,
        },
        "extraction": {
            "id": extraction.pk if extraction else None,
            "url": extraction.get_absolute_url() if extraction else None,
            "layer_ids": extraction.layer_ids if extraction else extract.layer_ids,
            "hidden_states_dir": f"{extraction.path}/hidden_states" if extraction else None,
            "tokens_per_second": extract.tokens_per_second,
            "model_load_seconds": extract.model_load_seconds,
            "bytes_per_token": extraction.bytes_per_token if extraction else None,
            "floor_bytes_per_token": extraction.floor_bytes_per_token if extraction else None,
        },
        "manifest_path": manifest.path if manifest else None,
        "vocab": {"d2t_path": vocab.d2t_path or None, "t2d_path": vocab.t2d_path or None},
        "training": {"steps": training.steps, "tokens_per_second": training.tokens_per_second,
                     "best_epoch": training.best_epoch, "split": training.split,
                     "stopped_early": training.stopped_early or None,
                     "loss_tokens_available": training.loss_tokens_available,
                     "loss_tokens_trained": training.loss_tokens_trained,
                     # a training across nodes: each rank's worker (runs.pipeline.nodes.selectors)
                     "nodes": training_nodes(training_id=training.pk)},
        "attempts": [attempt_dict(a) for a in run.attempts.all()],
        # Where the training's hidden states came from and how fast (issue 27): offline or online, the
        # trainer's wait for data, the capture servers' tokens/s, supply- or compute-bound, the advice.
        "supply": None if run.external else supply_dict(run=run),
        # Once the best is chosen by τ, the measurement of that best (the stage's own row measured the
        # trainer's choice, the checkpoint with the lowest validation loss).
        "acceptance": evaluation_dict(shown, evaluated.simulated_tau if evaluated else None),
        "serve_check": serve_check_dict(run_serve_check(evaluation_id=evaluation.pk) if evaluation else None),
        "checkpoints": [
            {"id": c.pk, "url": c.get_absolute_url(), "epoch": c.epoch, "path": c.path,
             "train_loss": c.train_loss, "val_loss": c.val_loss,
             "is_best": c.is_best, "val_metrics": c.val_metrics, "simulated_tau": c.simulated_tau,
             # The latest measurement not on a named suite (those are in tau_by_suite).
             "tau": next((e.tau for e in c.measured if not e.suite), None),
             # The τ the best is chosen by (runs.pipeline.best): ours, measured as the evaluate stage measured
             # every checkpoint; vLLM's on the same prompts beside it where a serve check ran (it chooses nothing).
             "vllm_tau": by_id[c.pk].vllm_tau if c.pk in by_id else None,
             "tau_for_best": by_id[c.pk].tau if c.pk in by_id else None, "serve_command": c.serve_command,
             "usable": not c.unusable_why, "unusable_why": c.unusable_why,
             # tau_by_suite; tau_by_k and recommended_k of the measurement the serve command's k comes from.
             **checkpoint_deploy_keys(checkpoint=c, score=by_id.get(c.pk))}
            for c in checkpoints
        ],
    }
    summary["glance"] = run_glance(stages=summary["stages"], training_run_id=training.pk, best=summary["best"], run=run)
    devices = {s["name"]: s.get("device") for s in summary["stages"]}
    for chosen in summary["backends"]:  # where it ran, once it did: a GPU count says where it was meant to
        chosen["device"] = devices.get(chosen["stage"]) or None
    return summary


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
