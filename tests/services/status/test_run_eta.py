"""The run's ETA (runs.pipeline.status.glance.run_eta): the glance's eta_seconds covers the current stage only, so
the page also says when the whole run ends, or "–" with the reason it cannot say (issue 28)."""
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Evaluation, StageStatus, TrainingRun
from runs.pipeline import selectors, services
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline.status.glance import run_eta
from runs.pipeline.launch.run_config import RunConfig


def _stage(label, status, done=0, total=0, seconds=None):
    name = {"Train draft": "train", "Measure acceptance": "evaluate"}.get(label, label)
    return {"name": name, "label": label, "status": status, "progress_done": done, "progress_total": total,
            "seconds": seconds}


DONE = [_stage("Prepare dataset", StageStatus.SUCCEEDED), _stage("Extract hidden states", StageStatus.SUCCEEDED),
        _stage("Build draft vocabulary", StageStatus.SUCCEEDED)]


def test_the_last_stage_running_gives_the_runs_end_at_its_rate():
    stages = DONE + [_stage("Train draft", StageStatus.SUCCEEDED),
                     _stage("Measure acceptance", StageStatus.RUNNING, done=8, total=32, seconds=20.0)]
    # 24 prompts left at 2.5 s each.
    assert run_eta(stages) == (60.0, "assumes Measure acceptance keeps the rate it has kept so far")


def test_a_stage_still_to_come_makes_the_end_unknown_and_says_which():
    stages = DONE + [_stage("Train draft", StageStatus.RUNNING, done=1, total=400, seconds=5.7),
                     _stage("Measure acceptance", StageStatus.QUEUED)]
    assert run_eta(stages) == (None, "Measure acceptance has not started: its length is unknown until it reports "
                                     "progress")


def test_a_running_stage_without_progress_has_no_rate():
    stages = DONE + [_stage("Train draft", StageStatus.SUCCEEDED),
                     _stage("Measure acceptance", StageStatus.RUNNING, done=0, total=0, seconds=25.0)]
    assert run_eta(stages) == (None, "Measure acceptance has reported no progress yet: no rate to go by")


def test_a_failed_run_and_an_ended_run_have_no_end_to_wait_for():
    failed = DONE + [_stage("Train draft", StageStatus.FAILED), _stage("Measure acceptance", StageStatus.QUEUED)]
    assert run_eta(failed) == (None, "a stage failed or was cancelled: the run will not end by itself")
    ended = DONE + [_stage("Train draft", StageStatus.SUCCEEDED), _stage("Measure acceptance", StageStatus.SUCCEEDED)]
    assert run_eta(ended) == (None, "the run has ended")


@pytest.mark.django_db
@pytest.mark.parametrize("suites, units, ends", [(0, 48, 270.0), (1, 96, 390.0)])
def test_a_training_run_ends_after_its_measurement_at_the_rate_the_same_targets_last_one_took(user, roots, suites,
                                                                                              units, ends):
    """Run A's evaluate stage counted 40 units in 100 s (2.5 s each); run B, on the same target, trains (100 of 400
    steps in 50 s: 150 s left) and will measure 12 prompts x 2 checkpoints x (1 + its suites) prompt sets x 2
    passes (the measurement, then the k table's probes, EAGLE3WEB_K_BEYOND_TRAINED=2), as its progress will
    count them: 48 units (120 s, ending in 270 s), or 96 with one suite (240 s, ending in 390 s)."""
    launch = lambda config: services.run_launch(user=user, target_path=roots / "target",  # noqa: E731
                                                dataset_path=roots / "chats.jsonl", config=config, enqueue=False)
    suite = roots / "code.jsonl"
    suite.write_text('{"messages": [{"role": "user", "content": "def f(x):"}, '
                     '{"role": "assistant", "content": "return x"}]}\n')
    a = launch(RunConfig())
    b = launch(RunConfig(eval_prompts=12, epochs=2, eval_suites={"code": str(suite)} if suites else {}))
    now = timezone.now()
    Evaluation.objects.filter(run=a).update(status=StageStatus.SUCCEEDED, started_at=now - timedelta(seconds=300),
                                            finished_at=now - timedelta(seconds=200), progress_done=40, progress_total=40)
    for stage in ("preparation", "extract_stage", "vocab_mapping"):
        type(getattr(b, stage)).objects.filter(pk=getattr(b, stage).pk).update(status=StageStatus.SUCCEEDED)
    TrainingRun.objects.filter(run=b).update(status=StageStatus.RUNNING, started_at=now - timedelta(seconds=50),
                                             progress_done=100, progress_total=400,
                                             lease_expires_at=now + timedelta(hours=1))
    glance = run_summary(selectors.run_get(pk=b.pk))["glance"]
    assert glance["run_eta_seconds"] == pytest.approx(ends, abs=1.0)
    assert glance["eta_seconds"] == pytest.approx(150.0, abs=1.0)  # the stage's own, as before
    assert glance["run_eta_note"] == (f"assumes Train draft keeps the rate it has kept so far; Measure acceptance: "
                                      f"{units} prompts x checkpoints x prompt sets x passes at 2.50 s each, as run "
                                      f"{a.pk} on the same target measured them")
