"""Where runs need someone: called where each event happens (a stage's failure, a measured τ, a loss
that is NaN, a lost worker) and by the workers' reconciler (stalled stages, lost delivery messages).

Each call runs in a savepoint of the caller's transaction and never raises: an alert that cannot be
made is logged, and the write it rode on (a stage's failure, a batch of metric points) goes on."""
from __future__ import annotations

import functools
import logging
import math
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from runs.alerts import selectors, services
from runs.alerts.models import AlertRule, Event, StageWatch
from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.lifecycle.stages import STAGES, STAGES_BY_NAME
from runs.projects import access

logger = logging.getLogger(__name__)


def _never_raises(check):
    @functools.wraps(check)
    def guarded(**kwargs):
        try:
            with transaction.atomic():
                return check(**kwargs)
        except Exception:  # noqa: BLE001 - see the module's docstring
            logger.exception("alert check %s failed (%s); what it rode on goes on", check.__name__, kwargs)
            return None
    return guarded


def _run(run_id: int | None) -> PipelineRun | None:
    if run_id is None:
        return None
    return PipelineRun.objects.select_related("training_run", "evaluation").filter(pk=run_id).first()


def _baseline_seen(rule: AlertRule) -> PipelineRun | None:
    """The rule's baseline run while its owner still sees it (staff may move a run to another project): one
    they no longer see is compared with as little as one deleted (runs.projects.access)."""
    if rule.baseline_run_id is None:
        return None
    runs = access.visible("run", PipelineRun.objects.select_related("training_run", "evaluation"), rule.owner)
    return runs.filter(pk=rule.baseline_run_id).first()


def _named(run: PipelineRun) -> str:
    return f"run {run.pk}" + (f" “{run.name}”" if run.name else "")


def _fire_all(*, event: str, run: PipelineRun, subject: str, text: str, rules: list[AlertRule] | None = None) -> int:
    rules = selectors.rules_watching(event=event, owner_id=run.owner_id) if rules is None else rules
    # A rule goes to its owner's addresses and webhook: one whose owner does not see the run's project
    # (a team rule watching a teammate's runs) must not carry it there. Its recipients are narrowed the same
    # way by alert_fire (runs.projects.access.who_sees).
    seeing = set(access.who_sees(get_user_model().objects.filter(pk__in={r.owner_id for r in rules}),
                                 project_id=run.project_id).values_list("pk", flat=True)) if rules else set()
    rules = [rule for rule in rules if rule.owner_id in seeing]
    return sum(services.alert_fire(rule=rule, subject=subject, text=f"{text}\n{rule.link(run.get_absolute_url())}",
                                   run_id=run.pk) is not None for rule in rules)


@_never_raises
def run_failed(*, run_id: int, stage_name: str, error: str) -> int:
    """A stage of a run failed (not cancelled): the run has stopped. How many rules fired."""
    run = _run(run_id)
    if run is None:
        return 0
    reason = (error.strip().splitlines() or ["no error recorded"])[0][:300]
    return _fire_all(event=Event.RUN_FAILED, run=run, subject=f"run {run.pk}",
                     text=f"{_named(run)} failed at {STAGES_BY_NAME[stage_name].label.lower()}: {reason}")


@_never_raises
def tau_recorded(*, run_id: int) -> int:
    """A run's τ was measured: the tau_below rules whose threshold or baseline run's τ it is under fire."""
    run = _run(run_id)
    tau = run.shown_tau if run is not None else None
    if tau is None:
        return 0
    fired = 0
    for rule in selectors.rules_watching(event=Event.TAU_BELOW, owner_id=run.owner_id):
        reasons = []
        if rule.threshold is not None and tau < rule.threshold:
            reasons.append(f"the threshold {rule.threshold:g}")
        baseline = _baseline_seen(rule)
        if baseline is not None and baseline.pk != run.pk and baseline.shown_tau is not None and tau < baseline.shown_tau:
            reasons.append(f"baseline {_named(baseline)}'s τ {baseline.shown_tau:.3f}" if baseline.project_id == run.project_id
                           # Its recipients see the run's project, not necessarily the baseline's: no name, no τ.
                           else "its baseline run's τ (a run of another project)")
        if reasons:
            fired += _fire_all(event=Event.TAU_BELOW, run=run, subject=f"run {run.pk}", rules=[rule],
                               text=f"{_named(run)}: τ {tau:.3f} is below {' and '.join(reasons)}")
    return fired


def _not_finite(value) -> bool:
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@_never_raises
def metrics_recorded(*, training_run_id: int, points: list[dict]) -> int:
    """A loss (a key with "loss" in it) became NaN or infinite: fires loss_nan. metrics_record calls this with
    the point where a loss series went non-finite, found in the batch's arrays, and only then."""
    bad = next((p for p in points if "loss" in str(p.get("key")) and _not_finite(p.get("value"))), None)
    if bad is None:
        return 0
    run = PipelineRun.objects.filter(training_run__pk=training_run_id).first()
    if run is None:
        return 0
    return _fire_all(event=Event.LOSS_NAN, run=run, subject=f"run {run.pk}",
                     text=f"{_named(run)}: {bad.get('split')} {bad.get('key')} is {float(bad['value'])} at step "
                          f"{bad.get('step')}")


@_never_raises
def worker_lost(*, stage_name: str, record_id: int, run_id: int | None, worker: str, attempt: int) -> int:
    """A running stage's worker stopped renewing its lease (the reconciler found it)."""
    run = _run(run_id)
    if run is None:
        return 0
    return _fire_all(event=Event.WORKER_LOST, run=run, subject=f"{stage_name} {record_id} attempt {attempt}",
                     text=f"{_named(run)}: worker {worker or '?'} was lost during "
                          f"{STAGES_BY_NAME[stage_name].label.lower()} (attempt {attempt})")


@_never_raises
def stages_stalled_check() -> int:
    """Running stages of runs whose progress has not moved for a stage_stalled rule's minutes. The progress
    last seen is kept per stage (StageWatch); a stall alerts once per attempt and progress value."""
    now = timezone.now()
    if not AlertRule.objects.filter(event=Event.STAGE_STALLED).exists():
        StageWatch.objects.all().delete()
        return 0
    fired = 0
    for kind in STAGES:
        rows = kind.model.objects.filter(status=StageStatus.RUNNING, started_at__isnull=False).exclude(
            run__external=True).values_list("pk", "run_id", "started_at", "progress_done")
        running = []
        for pk, run_id, started_at, done in rows:
            running.append(pk)
            watch, created = StageWatch.objects.get_or_create(
                stage=kind.name, record_id=pk,
                defaults={"started_at": started_at, "progress_done": done, "unchanged_since": now})
            if not created and (watch.started_at != started_at or watch.progress_done != done):
                StageWatch.objects.filter(pk=watch.pk).update(started_at=started_at, progress_done=done,
                                                              unchanged_since=now)
                continue
            fired += _stalled(kind=kind, pk=pk, run_id=run_id, watch=watch, now=now)
        StageWatch.objects.filter(stage=kind.name).exclude(record_id__in=running).delete()
    return fired


def _stalled(*, kind, pk: int, run_id: int, watch: StageWatch, now) -> int:
    run = _run(run_id)
    if run is None:
        return 0
    still = now - watch.unchanged_since
    rules = [r for r in selectors.rules_watching(event=Event.STAGE_STALLED, owner_id=run.owner_id)
             if still >= timedelta(minutes=r.stall_minutes or 0)]
    if not rules:
        return 0
    since = timezone.localtime(watch.unchanged_since)
    return _fire_all(event=Event.STAGE_STALLED, run=run, rules=rules,
                     subject=f"{kind.name} {pk} at {watch.progress_done} since {since:%Y-%m-%d %H:%M:%S}",
                     text=f"{_named(run)}: {kind.label.lower()} has made no progress since {since:%H:%M} "
                          f"({int(still.total_seconds() // 60)} min, stuck at {watch.progress_done})")


def reconcile() -> None:
    """What each worker's reconciler checks every tick."""
    stages_stalled_check()
    services.deliveries_flush()
