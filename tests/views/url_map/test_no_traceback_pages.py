"""No page or API answer shows Python's traceback banner: every GET of the URL map
(tests/views/projects/matrix_projects.py), asked by staff (who see everything) about objects whose stage and
every kind of job failed, some with the traceback an older row stored in its error. A failure reads as its
sentence; the frames sit under "details for developers" without the banner (workers.contract.failures)."""
from __future__ import annotations

import pytest

from runs.models import Checkpoint, DatasetCatalogue, Evaluation, StageAttempt, VerificationRequest
from runs.pipeline.jobs.models import DemoBuild, ServeCheck
from runs.pipeline.lifecycle.stage_services import stage_fail
from tests.views.projects.test_project_wall import APP_ROUTES, Wall
from tests.views.projects.matrix_projects import WALL
from workers.contract.failures import trace_for_developers

pytestmark = pytest.mark.django_db

BANNER = "Traceback (most recent call last)"


def legacy_error(message: str) -> str:
    """What stage_execute stored before failures were translated: "Type: message", then the traceback."""
    return (f"DatasetFormatError: {message}\n\n{BANNER}:\n  File \"/srv/workers/orchestration/tasks.py\", line 118, in stage_execute\n"
            f"    result = STAGE_BODIES[stage_name](record, reporter)\nDatasetFormatError: {message}\n")


def _raised() -> BaseException:
    try:
        {}["missing"]
    except KeyError as exc:
        return exc


def failed_everywhere(wall: Wall) -> None:
    """The own project's run failed at prepare (an older row's traceback), and a failed job of each kind."""
    run = wall.own["run"]
    from runs.models import PipelineRun

    prep = PipelineRun.objects.get(pk=run).preparation
    stage_fail(stage_name="prepare", record_id=prep.pk, error=legacy_error("/d/c.jsonl: no training rows: none"),
               log_tail=f"07:00:00 ERROR workers.orchestration.tasks: prepare failed\n{BANNER}:\n  File \"x.py\", line 1")
    StageAttempt.objects.create(run_id=run, stage="prepare", record_id=prep.pk, number=1, started_at=prep.queued_at,
                                outcome="failed", error=legacy_error("attempt's own"))
    checkpoint = Checkpoint.objects.get(pk=wall.own["checkpoint"])
    evaluation = Evaluation.objects.create(checkpoint=checkpoint, max_new_tokens=8)
    rows = {
        "catalogue": DatasetCatalogue.objects.create(dataset_id=wall.own["dataset"]),
        "verify": VerificationRequest.objects.create(extraction_id=wall.own["extraction"]),
        "serve_check": ServeCheck.objects.create(checkpoint=checkpoint),
        "evaluate": evaluation,
        "demo_build": DemoBuild.objects.create(num_conversations=10, train_steps=5),
    }
    for name, row in rows.items():
        stage_fail(stage_name=name, record_id=row.pk, error=legacy_error(f"{name} went wrong"), log_tail="")
    stage_fail(stage_name="regenerate", record_id=wall.own["regeneration"], error="The regeneration stopped: 'x'.",
               trace=trace_for_developers(_raised()), log_tail="")


def test_no_page_of_the_url_map_shows_a_traceback(roots):
    wall = Wall(roots)
    failed_everywhere(wall)
    probes = [probe for route in APP_ROUTES for probe in WALL[route] if probe.method == "GET"]
    assert len(probes) > 40  # the URL map's pages and API reads, not a handful
    shown = []
    for probe in probes:
        pk = wall.own[probe.kind] if probe.kind else 1
        response = wall.client("staff", probe.api).get(probe.url.format(id=pk, own_run=wall.own["run"]))
        body = response.content.decode(errors="replace")
        assert BANNER not in body, f"{probe.url} shows a traceback"
        shown.append(body)
    everything = "\n".join(shown)
    # The failures were on those pages, as sentences, with their frames for developers.
    assert "The dataset has no usable conversation: none." in everything
    assert "Details for developers" in everything and "line 118, in stage_execute" in everything
