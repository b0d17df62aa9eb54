"""What a checkpoint's model card states (workers.contract.checkpoints.model_card renders it), read from the database.

Every figure is a stored one: τ from the checkpoint's succeeded evaluations (the latest per prompt source
and k), the speed-up at each concurrency from its latest succeeded serve check (ServeCheck.concurrency_results), the
lineage from its run's dataset, regeneration, preparation and curation. Nothing measured is re-derived here.

τ by k and the recommended k come from the newest measurement's k table (Evaluation.k_table,
recommended_k); τ by named evaluation suite from its `tau_by_suite` once measurements store one (issue 39's
suites work); where none was measured the card says so."""
from __future__ import annotations

from pathlib import Path

from django.utils import timezone

from runs.checkpoints.k_selectors import newest_k_measurement, tau_by_k, tau_by_prompt_set
from runs.data.regeneration_selectors import dataset_provenance
from runs.checkpoints.models import Checkpoint
from runs.data.models import CurationAction, DatasetSample
from runs.pipeline.lifecycle.stage_record import StageStatus
from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import read_json_object
from workers.contract.checkpoints.serving import DEFAULT_SPECULATIVE_TOKENS, vllm_serve_command

MAX_CURATION_ACTIONS = 20  # the card lists the latest exclusions and inclusions; the counts cover them all


def _tau_rows(checkpoint: Checkpoint) -> list[dict]:
    rows, seen = [], set()
    for e in checkpoint.evaluations.filter(status=StageStatus.SUCCEEDED, tau__isnull=False).order_by("-id"):
        k = e.num_speculative_tokens or checkpoint.speculative_tokens
        key = (e.prompt_source or e.prompts_path, k)
        if key in seen:
            continue  # an older measurement of the same prompts at the same k: the latest stands
        seen.add(key)
        rows.append({"evaluation_id": e.pk, "suite": e.prompt_source or e.prompts_path or "held-out", "k": k,
                     "tau": e.tau, "tau_standard_error": e.tau_standard_error, "num_prompts": e.num_prompts,
                     "acceptance_per_position": e.acceptance_per_position, "device": e.device,
                     "max_new_tokens": e.max_new_tokens})
    return rows


def _speed_rows(checkpoint: Checkpoint) -> list[dict]:
    rows = []
    for check in checkpoint.serve_checks.filter(status=StageStatus.SUCCEEDED).order_by("-id"):
        levels = check.concurrency_results or []  # a row per concurrency (workers.stages.evaluate.serve_load)
        if not levels:  # a check from before the load: its prompts served one at a time
            levels = [{"concurrency": 1, "tokens_per_s_with": check.vllm_tokens_per_s_with,
                       "tokens_per_s_without": check.vllm_tokens_per_s_without, "speedup": check.vllm_speedup}]
        for level in levels:
            cpu = level["device"] == "cpu" if "device" in level else check.vllm_build == "cpu"
            rows.append({"serve_check_id": check.pk, "k": check.num_speculative_tokens, "cpu": cpu,
                         "vllm_version": check.vllm_version, "vllm_build": check.vllm_build, **level})
        break  # the latest check's table; older ones are on the checkpoint's page
    return rows


def _lineage(checkpoint: Checkpoint) -> dict:
    if checkpoint.training_run_id is None or checkpoint.training_run.run.dataset_id is None:
        return {}
    run = checkpoint.training_run.run
    dataset = run.dataset
    prep = getattr(run, "preparation", None)
    excluding = (CurationAction.objects.filter(dataset=dataset, action__in=("exclude", "include")).select_related("user")
                 .order_by("-created_at", "-id")[:MAX_CURATION_ACTIONS])
    return {
        "dataset": {"id": dataset.pk, "name": dataset.name, "path": dataset.path},
        "regenerated_from": dataset_provenance(dataset=dataset),
        "curation": {
            "excluded_at_preparation": prep.num_excluded if prep else None,
            "excluded_now": DatasetSample.objects.filter(dataset=dataset, excluded=True).count(),
            "actions": [{"at": a.created_at.isoformat(timespec="seconds"), "user": a.user.get_username() if a.user else None,
                         "action": a.action, "count": len(a.sample_ids or []), "detail": a.detail} for a in excluding],
        },
        "preparation": {"conversations": prep.num_conversations, "rows": prep.num_rows, "max_seq_len": prep.max_seq_len,
                        "loss_tokens": prep.loss_tokens, "truncated_rows": prep.num_truncated_rows,
                        "turns_dropped": prep.num_turns_dropped} if prep else {},
    }


def _target(checkpoint: Checkpoint) -> dict:
    run = checkpoint.training_run.run if checkpoint.training_run_id else None
    if run is not None and run.target_id is not None:
        t = run.target
        return {"name": t.name, "path": t.path, "num_layers": t.num_layers, "hidden_size": t.hidden_size,
                "vocab_size": t.vocab_size}
    path = checkpoint.verifier_path or "TARGET_MODEL_DIR"
    return {"name": Path(path).name, "path": path, "num_layers": None, "hidden_size": None, "vocab_size": None}


def _aux_layer_ids(checkpoint: Checkpoint) -> list[int] | None:
    """The draft's own `eagle_aux_hidden_state_layer_ids`: recorded at import, else read from its config.json
    (what vLLM will read from the exported copy)."""
    if checkpoint.aux_layer_ids:
        return list(checkpoint.aux_layer_ids)
    try:
        config = read_json_object(Path(checkpoint.path) / "config.json", InputError)
    except InputError:
        return None
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if isinstance(ids, list) else None


def _extracted_layer_ids(checkpoint: Checkpoint) -> list[int] | None:
    if checkpoint.training_run_id is None:
        return None
    stage = getattr(checkpoint.training_run.run, "extract_stage", None)
    return list(stage.layer_ids) if stage is not None and stage.layer_ids else None


def _suite_figures(checkpoint: Checkpoint) -> dict:
    """τ by k and the recommended k of the measurement the serve command's k comes from
    (runs.checkpoints.k_selectors.newest_k_measurement, held-out prompts), and τ on each prompt set the
    checkpoint was measured on: its newest measurement per named suite, and on the held-out prompts, as the
    run summary's `tau_by_suite` gives them; empty where none was measured."""
    measured = list(checkpoint.evaluations.filter(status=StageStatus.SUCCEEDED).order_by("-id"))
    newest = newest_k_measurement(checkpoint, measured)
    by_suite = tau_by_prompt_set(measured)
    by_k = {str(k): tau for k, tau in tau_by_k(newest).items()}
    return {"tau_by_suite": by_suite, "tau_by_k": by_k, "recommended_k": newest.recommended_k if newest else None}


def checkpoint_card_facts(*, checkpoint: Checkpoint, out_dir: Path) -> dict:
    """The card's facts for `checkpoint` exported to `out_dir` (its serve command names that folder)."""
    run = checkpoint.training_run.run if checkpoint.training_run_id else None
    target = _target(checkpoint)
    suites = _suite_figures(checkpoint)
    k = suites["recommended_k"] or checkpoint.speculative_tokens or DEFAULT_SPECULATIVE_TOKENS
    return {
        "exported_at": timezone.now().isoformat(timespec="seconds"),
        "checkpoint": {"id": checkpoint.pk, "epoch": checkpoint.epoch, "is_best": checkpoint.is_best,
                       "run_id": run.pk if run else None, "run_name": str(run) if run else None,
                       "source_path": checkpoint.path},
        "target": target,
        "draft": {"aux_layer_ids": _aux_layer_ids(checkpoint), "extracted_layer_ids": _extracted_layer_ids(checkpoint),
                  "draft_vocab_size": checkpoint.draft_vocab_size, "speculative_tokens": checkpoint.speculative_tokens},
        "tau": _tau_rows(checkpoint),
        **suites,
        "speedup": _speed_rows(checkpoint),
        "lineage": _lineage(checkpoint),
        "serve_command": vllm_serve_command(verifier=target["path"], checkpoint_dir=str(out_dir), num_speculative_tokens=k),
    }
