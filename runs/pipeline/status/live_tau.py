"""τ while training (issue 39): a run launched with live_tau (or stop_when_tau_flat) has each checkpoint
measured as soon as the trainer registers it, by a standalone evaluation on the evaluate queue, so
another worker measures while training goes on; and, with stop_when_tau_flat = P, the training stops
once the last P measured checkpoints did not beat the best τ measured before them.

One live measurement per run waits in the queue at a time: a checkpoint saved while the previous one's
measurement still waits for a worker takes that queued row over (the older checkpoint is skipped, the
newest is what the curve needs), so a trainer faster than its evaluator never piles up work that would
run long after training ended. A measurement that started runs to its end. The measurements decode the
run's held-out prompts with its eval_prompts and eval_max_new_tokens, as its evaluate stage does, and each
of its evaluation suites (run_config.eval_suites) likewise, one row per suite (Evaluation.suite) that waits
and is taken over the same way; they are shown on the run page like every measurement of its checkpoints
(runs.pipeline.status.changes), τ per suite included. The stop rule reads τ on the suite that chooses the run's
best (best_suite, or the mix of best_suite_weights once every suite in it is measured), held_out by default."""
from __future__ import annotations

import logging
import time

from django.db import transaction

from eagle3web.db import db_retry
from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.models import TrainingRun
from runs.pipeline.launch.setting_bounds import HELD_OUT
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.dispatch.queue import evaluation_enqueue

log = logging.getLogger(__name__)


def _measures_live(config: dict) -> bool:
    return bool(config.get("live_tau")) or config.get("stop_when_tau_flat") is not None


@transaction.atomic
def live_tau_request(*, checkpoint: Checkpoint) -> Evaluation | None:
    """Queue the measurement of a checkpoint just saved, when its run measures while training; None otherwise."""
    run = checkpoint.training_run.run
    config = run.config or {}
    if not _measures_live(config):
        return None
    held_out = None
    # The held-out prompts first, then each suite: a worker takes the queue in order.
    for suite, path in [("", ""), *((config.get("eval_suites") or {}).items())]:
        settings = dict(prompts_path=path, suite=suite, max_prompts=int(config.get("eval_prompts") or 32),
                        max_new_tokens=int(config.get("eval_max_new_tokens") or 64), num_speculative_tokens=None)
        live = Evaluation.objects.filter(checkpoint__training_run_id=checkpoint.training_run_id, run__isnull=True,
                                         requested_by__isnull=True, **settings)
        # A conditional UPDATE: a worker that took the row meanwhile made it running, and then a new row is queued.
        if live.filter(status=StageStatus.QUEUED).update(checkpoint=checkpoint):
            log.info("live τ: the queued measurement of run %s%s now measures epoch %d", run.pk,
                     f" on suite {suite}" if suite else "", checkpoint.epoch)
            evaluation = live.filter(checkpoint=checkpoint, status=StageStatus.QUEUED).first()
        else:
            evaluation = Evaluation.objects.create(checkpoint=checkpoint, **settings)
            evaluation_enqueue(evaluation_id=evaluation.pk)
        held_out = held_out or evaluation
    return held_out


def live_taus(*, training_run_id: int, with_name: bool = False):
    """(epoch, τ) of the run's measured checkpoints, in epoch order, on the suite that chooses its best (the
    held-out prompts unless best_suite or best_suite_weights say otherwise): each one's latest measurement;
    under weights, the mix of the latest on each suite, for the checkpoints measured on all of them.
    with_name: (those, the suite or mix in words)."""
    config = (TrainingRun.objects.filter(pk=training_run_id).values_list("run__config", flat=True).first()) or {}
    weights = config.get("best_suite_weights") or {}
    chosen = config.get("best_suite") or HELD_OUT
    names = list(weights) or [chosen]
    rows = (Evaluation.objects.filter(checkpoint__training_run_id=training_run_id, status=StageStatus.SUCCEEDED,
                                      tau__isnull=False).order_by("checkpoint__epoch", "-id")
            .values_list("checkpoint__epoch", "suite", "prompts_path", "tau"))
    latest: dict[int, dict[str, float]] = {}
    for epoch, suite, prompts_path, tau in rows:
        if not suite and prompts_path:
            continue  # a measurement on a prompts file someone asked for: no suite of the run
        latest.setdefault(epoch, {}).setdefault(suite or HELD_OUT, tau)
    taus = []
    for epoch, by_suite in sorted(latest.items()):
        if all(name in by_suite for name in names):
            taus.append((epoch, sum(w * by_suite[n] for n, w in weights.items()) if weights else by_suite[chosen]))
    if not with_name:
        return taus
    return taus, " + ".join(f"{w:g} {n}" for n, w in weights.items()) if weights else chosen




def tau_flat_reason(taus: list[tuple[int, float]], *, patience: int, on: str = HELD_OUT) -> str:
    """Why training should stop (τ flat), or "": the last `patience` measured checkpoints each did not beat
    the best τ measured before them. Fewer than patience + 1 measured: too early to say."""
    if patience < 1 or len(taus) <= patience:
        return ""
    before, last = taus[:-patience], taus[-patience:]
    best_epoch, best = max(before, key=lambda pair: (pair[1], -pair[0]))
    if any(tau > best for _, tau in last):
        return ""
    shown = ", ".join(f"epoch {e + 1}: {t:.3f}" for e, t in last)
    return (f"stopped early: τ stopped rising (stop_when_tau_flat={patience}): the last {patience} measured "
            f"checkpoint(s) ({shown}) did not beat τ {best:.3f} of epoch {best_epoch + 1}, τ on {on}")


def training_tau_flat(*, training_run_id: int, patience: int) -> str:
    taus, on = live_taus(training_run_id=training_run_id, with_name=True)
    return tau_flat_reason(taus, patience=patience, on=on)


CHECK_EVERY_SECONDS = 2.0  # how often the training's stop_early reads the database (it is asked every step)


def tau_flat_check(*, training_run_id: int, patience: int, every_s: float = CHECK_EVERY_SECONDS):
    """The training loop's stop_early for a run with stop_when_tau_flat: why it should stop, or ""; the
    measurements are read again at most every `every_s` seconds (the loop asks after every step)."""
    state = {"at": float("-inf"), "reason": ""}

    def check() -> str:
        now = time.monotonic()
        if not state["reason"] and now - state["at"] >= every_s:
            state["at"] = now
            state["reason"] = db_retry("live τ", training_tau_flat, training_run_id=training_run_id, patience=patience)
        return state["reason"]

    return check
