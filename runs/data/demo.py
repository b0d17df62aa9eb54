"""Where the demo's target and chats are (built by a DemoBuild job, runs.pipeline.jobs.services.demo_build_request),
so forms can offer them, how far their build is, so a launch naming them before they exist says so, and
whether the newest build failed, so the launch page can say why and offer to build it again."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings

from runs.pipeline.jobs.models import DemoBuild
from runs.pipeline.lifecycle.stage_record import StageStatus
from workers.contract.demo_build import CHATS_FILENAME, TARGET_DIRNAME


def demo_dir() -> Path:
    return settings.DATA_DIR / "demo"


def _paths(base: Path) -> tuple[Path, Path]:
    return base / TARGET_DIRNAME, base / CHATS_FILENAME


def demo_build_unfinished() -> DemoBuild | None:
    """The newest demo build that is queued or running, or None."""
    return DemoBuild.objects.filter(status__in=[StageStatus.QUEUED, StageStatus.RUNNING]).first()


def demo_build_progress(build: DemoBuild) -> str:
    """How far a build is, in the words the pages and a refused launch use."""
    if build.status == StageStatus.QUEUED:
        return "the demo target is still being built: waiting for a cpu worker to start it"
    if not build.progress_total:
        return "the demo target is still being built: starting"
    return f"the demo target is still being built: step {build.progress_done} of {build.progress_total}"


def demo_build_failed() -> DemoBuild | None:
    """The newest demo build when it failed and no demo is built or being built: the launch page then shows
    its sentence and a button that builds it again (runs.pipeline.jobs.services.demo_build_again). A failed
    build superseded by a later one, or by assets built by hand, is history for the admin."""
    newest = DemoBuild.objects.first()
    if newest is None or newest.status != StageStatus.FAILED or demo_paths():
        return None
    target, chats = _paths(Path(newest.out_dir))
    if newest.out_dir and (target / "config.json").exists() and chats.exists():
        return None
    return newest


def demo_paths() -> dict[str, str]:
    """Paths of the demo assets when they are built or being built (a launch then waits for them,
    demo_build_refusal), else {}."""
    target, chats = _paths(demo_dir())
    building = demo_build_unfinished()
    if building is not None and building.out_dir:
        target, chats = _paths(Path(building.out_dir))
        return {"target_path": str(target), "dataset_path": str(chats)}
    if (target / "config.json").exists() and chats.exists():
        return {"target_path": str(target), "dataset_path": str(chats)}
    return {}


def demo_build_refusal(*, target_path: str | Path, dataset_path: str | Path) -> tuple[str, str] | None:
    """(field, message) when the launch names a path an unfinished demo build is writing, else None.

    A launch is refused rather than queued behind the build: the build reports its step, the user sees
    about how long is left, and nothing waits in a queue that a failed build would never release."""
    building = demo_build_unfinished()
    if building is None or not building.out_dir:
        return None
    target, chats = (p.resolve() for p in _paths(Path(building.out_dir)))
    for field, value in (("target_path", target_path), ("dataset_path", dataset_path)):
        try:
            named = Path(value).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            continue
        if named == target or named == chats or target in named.parents:
            return field, (f"{demo_build_progress(building)}. Launch again once it is ready "
                           "(the launch page shows how far it is).")
    return None
