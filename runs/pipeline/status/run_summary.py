"""A run's summary: what the CLI prints, the run page polls and the API answers, with each stage's figures,
warnings and attempts, its checkpoints and their measurements."""
from __future__ import annotations

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.models import ExtractStage, PipelineRun, Preparation, StageAttempt, VocabMapping
from runs.pipeline.lifecycle.stage_record import StageRecord
from runs.pipeline.nodes.selectors import training_nodes
from runs.fleet.selectors import run_backends
from runs.data.regeneration_selectors import regeneration_dict, run_data_policy
from runs.pipeline import best
from runs.pipeline.lifecycle.failure_selectors import failure_of, run_failure
from runs.pipeline.selectors import run_checkpoints, run_extraction
from runs.pipeline.status.glance import run_glance
from runs.pipeline.status.run_status import run_is_finished, run_stages, run_status, run_status_reason
from runs.pipeline.online.selectors import is_online, online_note, supply_dict
from runs.checkpoints.serve_check_selectors import run_serve_check, serve_check_dict
from runs.checkpoints.k_selectors import checkpoint_deploy_keys
from runs.pipeline.status.upstream_commands import run_speculators_train_command
from runs.pipeline.shards.selectors import run_shards


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



def stage_dict(name: str, label: str, record: StageRecord, shards: list[dict] | None = None) -> dict:
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
        # An online run's stage extracts nothing (runs.pipeline.online.selectors); said beside the stage, not only
        # in its log.
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
        "stages": [stage_dict(name, label, record, shards.get(name)) for name, label, record in run_stages(run)],
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
