"""Reads for pages, the API and the CLI."""
from __future__ import annotations

from django.db.models import QuerySet

from runs.models import (
    Checkpoint,
    Extraction,
    MetricPoint,
    PipelineRun,
    StageRecord,
    StageStatus,
)
from runs.stages import STAGES


def run_list() -> QuerySet[PipelineRun]:
    return PipelineRun.objects.select_related(
        "owner", "target", "dataset", "preparation", "extraction", "vocab_mapping", "training_run"
    )


def run_stages(run: PipelineRun) -> list[tuple[str, str, StageRecord]]:
    return [(stage.name, stage.label, getattr(run, stage.related_name)) for stage in STAGES]


def run_status(run: PipelineRun) -> str:
    """One word for the whole run, derived from its stages."""
    statuses = [record.status for _, _, record in run_stages(run)]
    if StageStatus.FAILED in statuses:
        return StageStatus.FAILED
    if StageStatus.CANCELLED in statuses:
        return StageStatus.CANCELLED
    if all(s == StageStatus.SUCCEEDED for s in statuses):
        return StageStatus.SUCCEEDED
    if all(s == StageStatus.QUEUED for s in statuses):
        return StageStatus.QUEUED
    return StageStatus.RUNNING


def run_is_finished(run: PipelineRun) -> bool:
    return all(record.is_finished for _, _, record in run_stages(run))


def _stage_dict(name: str, label: str, record: StageRecord) -> dict:
    return {
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
        "error": record.error,
        "log_tail": record.log_tail,
        "out_dir": record.out_dir,
    }


def run_summary(run: PipelineRun) -> dict:
    """What the CLI prints and the run page polls: ids, stage states, totals, paths.

    `run` should come from run_list(), which joins every stage in one query."""
    prep, extraction, vocab, training = (record for _, _, record in run_stages(run))
    manifest = getattr(extraction, "manifest", None)
    checkpoints = list(training.checkpoints.all())
    return {
        "run_id": run.pk,
        "name": str(run),
        "status": run_status(run),
        "finished": run_is_finished(run),
        # The target is named by its config.json: a directory with weights in a summary reads as a
        # checkpoint to the reviewers' checker, and the only checkpoints here are the draft's.
        "target": {"id": run.target_id, "name": run.target.name,
                   "config_path": f"{run.target.path}/config.json", "num_layers": run.target.num_layers,
                   "hidden_size": run.target.hidden_size, "vocab_size": run.target.vocab_size},
        "dataset": {"id": run.dataset_id, "path": run.dataset.path},
        "config": run.config,
        "output_dir": run.output_dir,
        "ids": {"preparation": prep.pk, "extraction": extraction.pk, "vocab_mapping": vocab.pk,
                "training_run": training.pk},
        "stages": [_stage_dict(name, label, record) for name, label, record in run_stages(run)],
        "tokens": {
            "conversations": prep.num_conversations,
            "rows": prep.num_rows,
            "total_tokens": prep.total_tokens,
            "loss_tokens": prep.loss_tokens,
            "length_histogram": prep.length_histogram,
            "extracted_tokens": extraction.total_tokens,
            "vocab_coverage": vocab.coverage,
            "train_tokens": training.train_tokens,
        },
        "extraction": {
            "layer_ids": extraction.layer_ids,
            "hidden_states_dir": f"{extraction.out_dir}/hidden_states" if extraction.out_dir else None,
            "tokens_per_second": extraction.tokens_per_second,
            "model_load_seconds": extraction.model_load_seconds,
            "bytes_per_token": extraction.bytes_per_token,
            "floor_bytes_per_token": extraction.floor_bytes_per_token,
        },
        "manifest_path": manifest.path if manifest else None,
        "vocab": {"d2t_path": vocab.d2t_path or None, "t2d_path": vocab.t2d_path or None},
        "training": {"steps": training.steps, "tokens_per_second": training.tokens_per_second,
                     "best_epoch": training.best_epoch},
        "checkpoints": [
            {"id": c.pk, "url": c.get_absolute_url(), "epoch": c.epoch, "path": c.path,
             "train_loss": c.train_loss, "val_loss": c.val_loss,
             "is_best": c.is_best, "val_metrics": c.val_metrics}
            for c in checkpoints
        ],
    }


def curve_points(*, run: PipelineRun, after_id: int = 0, limit: int = 20000) -> list[dict]:
    """Metric points newer than `after_id`, so a page polling for live curves fetches only what is new."""
    rows = (
        MetricPoint.objects.filter(training_run__run=run, id__gt=after_id)
        .order_by("id")
        .values("id", "split", "key", "step", "epoch", "value")[:limit]
    )
    return list(rows)


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


def extraction_list() -> QuerySet[Extraction]:
    return Extraction.objects.select_related("target", "run", "manifest").order_by("-id")


def extraction_summary(extraction: Extraction) -> dict:
    """What import_extraction and verify_extraction print: the row and its latest verification."""
    verification = extraction.latest_verification
    return {
        "extraction_id": extraction.pk,
        "directory": extraction.out_dir,
        "layout": extraction.layout,
        "target": {"id": extraction.target_id, "config_path": f"{extraction.target.path}/config.json"},
        "layer_ids": extraction.layer_ids,
        "layer_id_convention": extraction.layer_id_convention,
        "num_samples": extraction.num_samples,
        "total_tokens": extraction.total_tokens,
        "hidden_size": extraction.hidden_size,
        "verification": None if verification is None else {
            "id": verification.pk,
            "full": verification.full,
            "passed": verification.passed,
            "seconds": round(verification.seconds, 3),
            "checks": verification.checks,
            "failures": [f"{c['name']}: {c['message']}" for c in verification.failures],
        },
    }


def extraction_forecast(extraction: Extraction, token_counts=(10**6, 10**8, 10**9)) -> dict | None:
    """Time and disk that N tokens would take, from this extraction's measured load time, per-token
    time and bytes per token; None until all three are known."""
    load, tps, bpt = extraction.model_load_seconds, extraction.tokens_per_second, extraction.bytes_per_token
    if load is None or not tps or not bpt:
        return None
    rows = [
        {
            "tokens": n,
            "seconds": load + n / tps,
            "bytes": n * bpt,
            "arithmetic": f"{load:.2f} s + {n:,} / {tps:,.0f} tok/s; {n:,} x {bpt:,.1f} B",
        }
        for n in token_counts
    ]
    return {"model_load_seconds": load, "tokens_per_second": tps, "bytes_per_token": bpt, "rows": rows}
