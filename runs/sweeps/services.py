"""Launching a sweep: every run it varies, stored and validated in one transaction (all or none), each
through the very launch a single run goes through (runs.pipeline.services.run_launch)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from runs.pipeline.models import PipelineRun
from runs.sweeps.models import Sweep, SweepRun
from runs.pipeline import services as run_services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import MAX_NAME_CHARS
from runs.pipeline.launch.setting_checks import check_run_name
from runs.projects.access import runs_visible
from runs.roles import require
from runs.sweeps.release import sweep_release
from runs.sweeps.spec import MODES, SweepError, Varied, check_keys, expand, settings_text
from workers.contract.errors import InputError

MAX_PARALLEL = 8
# A run's own field an error may name, as the sweep's key for it.
FIELD_KEYS = {"dataset_path": "dataset"}


def _refusal(exc: InputError, *, combo: dict[str, tuple[str, Any]], position: int, count: int) -> InputError:
    """The error of one run of the sweep, naming the swept key and value to blame, or else the run."""
    field = getattr(exc, "field", None)
    key = FIELD_KEYS.get(field, field)
    if key in combo:
        return SweepError(f"--vary {key}={combo[key][0]}: {exc}", in_form=f"{key} = {combo[key][0]}: {exc}")
    settings = settings_text({k: text for k, (text, _) in combo.items()})
    return SweepError(f"run {position} of {count} ({settings}): {exc}", field=field or "vary")


@transaction.atomic
def sweep_launch(
    *,
    user: AbstractBaseUser,
    target_path: str | Path,
    dataset_path: str | Path,
    config: RunConfig,
    varied: list[Varied],
    mode: str = "grid",
    name: str = "",
    parallel: int = 1,
    enqueue: bool = True,
    check: str = "fleet",
    project: str | None = None,
) -> Sweep:
    """Store a sweep and all its runs, each launched as a single run is with `config` and its own swept
    settings; the first refusal rolls everything back and names the swept key and value to blame.

    With `enqueue`, the first `parallel` runs go to the queue after commit and the others follow as
    earlier ones finish (runs.sweeps.release); without, nothing is queued and every run counts as
    handed over (run_pipeline --inline's way: the caller runs them itself). Every run goes into `project`
    (by name; None: Default, as a single launch naming none: runs.projects.services.launch_project)."""
    require(user, "launch")
    if mode not in MODES:
        raise SweepError(f"mode must be {' or '.join(MODES)}, got {str(mode)[:20]!r}", field="mode")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MAX_PARALLEL:
        raise SweepError(f"parallel must be a whole number between 1 and {MAX_PARALLEL}, got {str(parallel)[:20]}",
                         field="parallel")
    combos = expand(check_keys(list(varied)), mode=mode)
    name = check_run_name(name) or f"sweep of {' × '.join(v.key for v in varied)}"
    sweep = Sweep.objects.create(
        owner=user, name=name, mode=mode, parallel=parallel, varied=[[v.key, list(v.texts)] for v in varied],
        base={"target_path": str(target_path), "dataset_path": str(dataset_path), "config": config.as_dict()})
    now = timezone.now()
    for position, combo in enumerate(combos, start=1):
        settings = {key: text for key, (text, _) in combo.items()}
        overrides = {key: value for key, (_, value) in combo.items() if key != "dataset"}
        try:
            run = run_services.run_launch(
                user=user, target_path=target_path,
                dataset_path=combo["dataset"][1] if "dataset" in combo else dataset_path,
                config=replace(config, **overrides), name=f"{name}: {settings_text(settings)}"[:MAX_NAME_CHARS],
                enqueue=False, check=check, project=project)
        except InputError as exc:
            raise _refusal(exc, combo=combo, position=position, count=len(combos)) from exc
        SweepRun.objects.create(sweep=sweep, run=run, position=position, values=settings,
                                released_at=None if enqueue else now)
    if enqueue:
        sweep_release(sweep_id=sweep.pk)
    return sweep


@transaction.atomic
def sweep_cancel(*, sweep: Sweep, user: AbstractBaseUser) -> int:
    """Cancel every unfinished run of the sweep the user sees (runs moved to a project they do not see are
    not theirs to stop), the held ones too (they are then never queued); the last first, so that
    cancelling a running one hands over no held one that is about to be cancelled."""
    require(user, "cancel")
    entries = SweepRun.objects.filter(sweep=sweep, run__in=runs_visible(PipelineRun.objects.all(), user))
    runs = [entry.run for entry in entries.select_related("run").order_by("-position")]
    return sum(run_services.run_cancel(run=run, user=user) for run in runs)
