"""Where a run is, in one line of figures: the run page's header and the summary's `glance`.

Read from what the summary already holds (its stages and checkpoints) plus one query for the latest
value of each curve (MetricSeries keeps it, so no point is read)."""
from __future__ import annotations

import re

from runs.models import StageStatus
from runs.tracking.models import MetricSeries

# The curves the header shows per TTT step: the step's index is the key's suffix (loss_0, full_acc_1, ...).
HEADLINE = ("loss", "full_acc")
_TTT = re.compile(r"^(?P<family>[a-z_]+?)_(?P<step>\d+)$")


def _latest(training_run_id: int) -> dict:
    """{"train": {"loss": [v0, v1, ...], "full_acc": [...]}, "val": {...}, "step": last train step}."""
    out: dict = {"train": {}, "val": {}, "step": None, "epoch": None}
    rows = MetricSeries.objects.filter(training_run_id=training_run_id).values_list(
        "split", "key", "last_value", "last_step", "last_epoch")
    for split, key, value, step, epoch in rows:
        match = _TTT.match(key)
        if split not in out or not match or match["family"] not in HEADLINE:
            continue
        values = out[split].setdefault(match["family"], [])
        index = int(match["step"])
        values.extend([None] * (index + 1 - len(values)))
        values[index] = value
        if split == "train" and step is not None and (out["step"] is None or step > out["step"]):
            out["step"], out["epoch"] = step, epoch
    return out


def run_glance(*, stages: list[dict], training_run_id: int, best: dict | None) -> dict:
    """stage (the one running, else the first not done), its progress and ETA, the latest loss and
    accuracy per TTT step, the best checkpoint's τ (the summary's `best`, runs.pipeline.best) and whether
    that is still provisional (the evaluate stage has not measured every checkpoint: the best may move),
    and how many warnings the stages carry."""
    current = next((s for s in stages if s["status"] == StageStatus.RUNNING), None) or next(
        (s for s in stages if s["status"] != StageStatus.SUCCEEDED), None)
    eta = None
    if current and current["status"] == StageStatus.RUNNING and current["progress_done"] and current["seconds"]:
        remaining = max(0, current["progress_total"] - current["progress_done"])
        eta = round(current["seconds"] * remaining / current["progress_done"], 1)
    train = next(s for s in stages if s["name"] == "train")
    evaluate = next((s for s in stages if s["name"] == "evaluate"), None)  # a run trained elsewhere has none
    return {
        "stage": current["name"] if current else None,
        "stage_label": current["label"] if current else "all stages done",
        "stage_status": current["status"] if current else StageStatus.SUCCEEDED,
        "progress_done": current["progress_done"] if current else None,
        "progress_total": current["progress_total"] if current else None,
        "eta_seconds": eta,
        "train_step": train["progress_done"] or None,
        "train_steps": train["progress_total"] or None,
        "latest": _latest(training_run_id),
        "best_tau": (best or {}).get("tau"),
        "best_provisional": bool(best) and bool(best.get("provisional") or (
            evaluate is not None and evaluate["status"] != StageStatus.SUCCEEDED)),
        "warnings": sum(len(s["warnings"]) for s in stages),
    }
