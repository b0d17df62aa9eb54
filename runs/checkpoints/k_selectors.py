"""A checkpoint's k table as the pages, the summary and the serve command read it (measured by the evaluate
stage, workers.stages.evaluate.k_table, kept on each Evaluation as `k_table` and `recommended_k`)."""
from __future__ import annotations

from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.launch.setting_bounds import HELD_OUT
from runs.pipeline.lifecycle.stage_record import StageStatus


def tau_by_k(evaluation: Evaluation | None) -> dict[int, float]:
    """{k: τ} of one measurement; empty where it was made before the k table (or with none)."""
    rows = ((evaluation.k_table or {}).get("rows") or {}) if evaluation is not None else {}
    return {int(k): row["tau"] for k, row in sorted(rows.items(), key=lambda kv: int(kv[0]))}


def k_rows(evaluation: Evaluation | None) -> list[dict]:
    """The table for a page: one dict per k (k, tau, acceptance_per_position, tokens_per_target_forward,
    recommended)."""
    if evaluation is None or not evaluation.k_table:
        return []
    rows = evaluation.k_table.get("rows") or {}
    return [{"k": int(k), **row, "recommended": int(k) == evaluation.recommended_k}
            for k, row in sorted(rows.items(), key=lambda kv: int(kv[0]))]


def newest_k_measurement(checkpoint: Checkpoint, measured: list[Evaluation] | None = None) -> Evaluation | None:
    """The checkpoint's newest succeeded measurement with a k table, on prompts of no named suite (the
    held-out ones): the one its serve command, the run summary's `tau_by_k`/`recommended_k`, the checkpoints
    table's "k to serve" and the model card all read, so that they agree. A suite's k is shown beside that
    suite's τ only (compare): a code suite measured last must not set the k every request is served with.
    Reads `measured` (its succeeded measurements, newest first) where given or where
    runs.pipeline.selectors.checkpoints_with_tau prefetched it, else one query."""
    measured = measured if measured is not None else getattr(checkpoint, "measured", None)
    if measured is None:
        measured = Evaluation.objects.filter(checkpoint=checkpoint, status=StageStatus.SUCCEEDED, suite="",
                                             recommended_k__isnull=False).order_by("-id")[:1]
    return next((e for e in measured if e.recommended_k and not e.suite), None)


def checkpoint_recommended_k(checkpoint: Checkpoint) -> int | None:
    """The k the newest succeeded measurement with a k table recommends (None: none made one)."""
    newest = newest_k_measurement(checkpoint)
    return newest.recommended_k if newest else None


def live_tau_by_suite(checkpoint: Checkpoint) -> dict[str, float]:
    """{suite: τ} of a checkpoint measured on named suites while training (runs.pipeline.status.live_tau), before the
    evaluate stage decides the run's figures (runs.pipeline.best): the latest on each suite and on the
    held-out prompts; {} where no named suite was measured. Reads the prefetched `measured` only."""
    measured = getattr(checkpoint, "measured", None) or []
    return tau_by_prompt_set(measured) if any(e.suite for e in measured) else {}


def tau_by_prompt_set(measured: list[Evaluation]) -> dict[str, float]:
    """{suite: τ} of the newest of `measured` (succeeded, newest first) on each named suite and on the
    held-out prompts (HELD_OUT); a measurement on other prompts of no suite is none of them."""
    taus: dict[str, float] = {}
    for e in measured:
        if e.tau is not None and (e.suite or not e.prompts_path):
            taus.setdefault(e.suite or HELD_OUT, e.tau)
    return taus


def checkpoint_deploy_keys(*, checkpoint: Checkpoint, score) -> dict:
    """The run summary's keys for choosing what to deploy, per checkpoint: `tau_by_suite` ({suite: τ},
    runs.pipeline.best's CheckpointScore), and `tau_by_k` ({k: τ}) and `recommended_k` of the measurement the
    serve command's k comes from: the newest with a k table (newest_k_measurement), so that they agree."""
    evaluation = newest_k_measurement(checkpoint)
    by_suite = dict(score.tau_by_suite) if score is not None and score.tau_by_suite else live_tau_by_suite(checkpoint)
    return {"tau_by_suite": by_suite,
            "tau_by_k": tau_by_k(evaluation), "recommended_k": evaluation.recommended_k if evaluation else None}
