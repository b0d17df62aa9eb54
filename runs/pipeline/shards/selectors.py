"""Reads of a stage's shards (issue 36) for the run page, the API, `run_pipeline --json` and the Workers page."""
from __future__ import annotations

from runs.pipeline.shards.models import StageShard
from runs.pipeline.lifecycle.stage_record import StageStatus


def shard_dict(shard: StageShard) -> dict:
    """One shard as the summary carries it: `rows` is [first, stop) in the order one worker does them."""
    rate = shard.rows_per_second
    return {
        "index": shard.index,
        "rows": [shard.row_start, shard.row_stop],
        "span": shard.span_label,
        "worker": shard.worker,
        "state": shard.status,
        "attempts": shard.attempts,
        "rows_done": shard.rows_done,
        "rows_total": shard.rows,
        "rows_per_second": round(rate, 2) if rate is not None else None,
        "batch_tokens": shard.batch_tokens,
        "started_at": shard.started_at.isoformat() if shard.started_at else None,
        "finished_at": shard.finished_at.isoformat() if shard.finished_at else None,
        "error": shard.error,
        "log_tail": shard.log_tail,
    }


def run_shards(*, run_id: int) -> dict[str, list[dict]]:
    """The run's shards by stage name, in index order (one query); a stage that ran whole has none."""
    found: dict[str, list[dict]] = {}
    for shard in StageShard.objects.filter(run_id=run_id).order_by("stage", "index"):
        found.setdefault(shard.stage, []).append(shard_dict(shard))
    return found


def shards_held(*, workers: list[str]) -> dict[str, list[StageShard]]:
    """The running shards each named worker holds (the Workers page says which)."""
    held: dict[str, list[StageShard]] = {}
    for shard in StageShard.objects.filter(worker__in=workers, status=StageStatus.RUNNING).select_related("run"):
        held.setdefault(shard.worker, []).append(shard)
    return held
