"""What a run page needs every 2 s while its run trains (issue 40): the part of the run summary that
moves without the run's state counter (runs.pipeline.status.changes), a few hundred bytes where the whole
summary (checkpoints, attempts, histograms, the supply's figures, commands) is tens of kB.

The page asks `GET /api/v1/runs/<id>/status/?since=<state_version>` with the `state_version` of the
whole summary it holds: while that is still the run's state counter the answer is this live part
(`"live": true`); once it moved, the whole summary again, with its new `state_version`.

Only what can move without the state counter comes: a stage's status, and which stage the header
follows, move it; so does every field of a stage that is not running. So the live part holds the running
stages' duration, progress and log, and the header's moving figures (its progress, ETAs, the curves'
latest values); the page keeps the rest of the summary it holds."""
from __future__ import annotations

from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.status.glance import run_glance
from runs.pipeline.status.run_status import run_stages
from runs.pipeline.status.run_summary import stage_dict

# A running stage's fields a progress report moves (runs.pipeline.status.changes.PROGRESS_FIELDS), and its
# duration; its `progress` is done / total, which the page works out.
LIVE_STAGE_FIELDS = ("name", "seconds", "progress_done", "progress_total", "log_tail")
# The header's figures that move with progress and points (runs.pipeline.status.glance.run_glance); the stage
# it follows, the best's τ and the warnings move with the state counter only.
LIVE_GLANCE_FIELDS = ("progress_done", "progress_total", "eta_seconds", "run_eta_seconds", "run_eta_note",
                      "train_step", "train_steps", "latest")


def run_live_summary(run: PipelineRun, *, state_version: int) -> dict:
    """`run` from run_get (its stages joined)."""
    stages = [stage_dict(name, label, record) for name, label, record in run_stages(run)]
    glance = run_glance(stages=stages, training_run_id=run.training_run.pk, best=None, run=run)
    return {
        "live": True, "state_version": state_version,
        "stages": [{key: stage[key] for key in LIVE_STAGE_FIELDS}
                   for stage in stages if stage["status"] == StageStatus.RUNNING],
        "glance": {key: glance[key] for key in LIVE_GLANCE_FIELDS},
    }
