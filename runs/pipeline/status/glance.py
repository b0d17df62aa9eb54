"""Where a run is, in one line of figures: the run page's header and the summary's `glance`.

Read from what the summary already holds (its stages and checkpoints) plus one query for the latest
value of each curve (MetricSeries keeps it, so no point is read)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from runs.checkpoints.models import Evaluation
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.tracking.models import MetricSeries
from workers.contract.acceptance import evaluation_phases

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


@dataclass(frozen=True)
class StageEstimate:
    """A stage that has not started, estimated from a measured rate: `units` of work at `seconds_per_unit`."""

    name: str
    units: int
    seconds_per_unit: float
    basis: str  # what the rate was measured on, said with the ETA


def evaluate_estimate(*, run) -> StageEstimate | None:
    """The measure-acceptance stage of `run` before it starts, counted as its progress counts
    (workers.orchestration.stage_runners _evaluate): its prompts (eval_prompts; a suite's file may hold fewer) x its
    checkpoints (epochs: one each) x its prompt sets (the held-out prompts and each of eval_suites) x the passes over
    each (the measurement, then the k table's probes: workers.contract.acceptance.evaluation_phases), at the seconds per
    unit that the latest measured run of the same target took. None without one."""
    config = run.config or {}
    units = (int(config.get("eval_prompts") or 0) * int(config.get("epochs") or 0)
             * (1 + len(config.get("eval_suites") or {})) * evaluation_phases(settings.EAGLE3WEB_K_BEYOND_TRAINED))
    if run.external or not units or run.target_id is None:
        return None
    latest = Evaluation.objects.filter(
        run__target_id=run.target_id, status=StageStatus.SUCCEEDED, progress_total__gt=0, started_at__isnull=False,
        finished_at__isnull=False).exclude(run_id=run.pk).order_by("-finished_at").values_list(
        "run_id", "started_at", "finished_at", "progress_total").first()
    if latest is None:
        return None
    other, started, finished, total = latest
    return StageEstimate(name="evaluate", units=units, seconds_per_unit=(finished - started).total_seconds() / total,
                         basis=f"run {other} on the same target")


def run_eta(stages: list[dict], *, estimates: dict[str, StageEstimate] | None = None) -> tuple[float | None, str]:
    """Seconds until the run's last stage ends, and what that assumes; (None, why) when it cannot be said.

    A running stage's remaining time is its remaining progress at the rate it has kept so far (a stage's work
    comes in units of one size: prompts, rows, steps). A stage that has not started counts only with an
    estimate (`estimates`, by stage name: evaluate_estimate); without one the run's end is unknown rather than
    guessed, and the current stage's own ETA still shows."""
    estimates = estimates or {}
    left = [s for s in stages if s["status"] != StageStatus.SUCCEEDED]
    if not left:
        return None, "the run has ended"
    if any(s["status"] in (StageStatus.FAILED, StageStatus.CANCELLED) for s in left):
        return None, "a stage failed or was cancelled: the run will not end by itself"
    total, assumed = 0.0, []
    for stage in left:
        if stage["status"] == StageStatus.RUNNING:
            if not (stage["progress_done"] and stage["seconds"] and stage["progress_total"]):
                return None, f"{stage['label']} has reported no progress yet: no rate to go by"
            remaining = max(0, stage["progress_total"] - stage["progress_done"])
            total += stage["seconds"] * remaining / stage["progress_done"]
            assumed.append(f"{stage['label']} keeps the rate it has kept so far")
        elif (estimate := estimates.get(stage.get("name"))) is not None:
            total += estimate.units * estimate.seconds_per_unit
            assumed.append(f"{stage['label']}: {estimate.units:,} prompts x checkpoints x prompt sets x passes at "
                           f"{estimate.seconds_per_unit:.2f} s each, as {estimate.basis} measured them")
        else:
            return None, f"{stage['label']} has not started: its length is unknown until it reports progress"
    return round(total, 1), "assumes " + "; ".join(assumed)


def _estimates(stages: list[dict], run) -> dict[str, StageEstimate]:
    """Estimates of the stages still to start that have one (one query, only while the evaluate stage waits)."""
    waiting = any(s["name"] == "evaluate" and s["status"] == StageStatus.QUEUED for s in stages) and all(
        s["status"] in (StageStatus.RUNNING, StageStatus.SUCCEEDED) for s in stages if s["name"] != "evaluate")
    estimate = evaluate_estimate(run=run) if run is not None and waiting else None
    return {"evaluate": estimate} if estimate else {}


def run_glance(*, stages: list[dict], training_run_id: int, best: dict | None, run=None) -> dict:
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
        # The run's end: the ETA above is the current stage's alone (run_eta says what it assumes or why not).
        **dict(zip(("run_eta_seconds", "run_eta_note"), run_eta(stages, estimates=_estimates(stages, run)))),
        "train_step": train["progress_done"] or None,
        "train_steps": train["progress_total"] or None,
        "latest": _latest(training_run_id),
        "best_tau": (best or {}).get("tau"),
        "best_provisional": bool(best) and bool(best.get("provisional") or (
            evaluate is not None and evaluate["status"] != StageStatus.SUCCEEDED)),
        "warnings": sum(len(s["warnings"]) for s in stages),
    }
