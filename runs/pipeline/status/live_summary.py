"""What a run page needs every 2 s while its run trains (issue 40): the part of the run summary that
moves without the run's state counter (runs.pipeline.status.changes: a running stage's progress and log, the
curves' latest values in the header), a few hundred bytes where the whole summary (checkpoints,
attempts, histograms, the supply's figures, commands) is tens of kB.

The page asks `GET /api/v1/runs/<id>/status/?since=<state_version>` with the `state_version` of the
whole summary it holds: while that is still the run's state counter the answer is this live part
(`"live": true`); once it moved, the whole summary again, with its new `state_version`."""
from __future__ import annotations

from runs.pipeline.models import PipelineRun
from runs.pipeline.lifecycle.stage_record import StageStatus
from runs.pipeline.status.glance import run_glance
from runs.pipeline.status.run_status import run_is_finished, run_stages, run_status
from runs.pipeline.status.run_summary import stage_dict

# A stage's fields a progress report moves (runs.pipeline.status.changes.PROGRESS_FIELDS, with what derives from
# them); every other field moves the state counter, which brings the whole summary.
LIVE_STAGE_FIELDS = ("name", "status", "seconds", "progress_done", "progress_total", "progress")
# The header's figures read from checkpoints and measurements (the best's τ, choosing it costs the most):
# they move with the state counter only, so the page keeps those of its whole summary.
GLANCE_OF_STATE = ("best_tau", "best_provisional", "warnings")


def run_live_summary(run: PipelineRun, *, state_version: int) -> dict:
    """`run` from run_get (its stages joined). A running stage's log tail comes along; a stage not running
    cannot change its log without moving the state counter."""
    stages = [stage_dict(name, label, record) for name, label, record in run_stages(run)]
    glance = run_glance(stages=stages, training_run_id=run.training_run.pk, best=None, run=run)
    for key in GLANCE_OF_STATE:
        del glance[key]
    return {
        "run_id": run.pk, "live": True, "state_version": state_version,
        "status": run_status(run), "finished": run_is_finished(run),
        "stages": [{**{key: stage[key] for key in LIVE_STAGE_FIELDS},
                    **({"log_tail": stage["log_tail"]} if stage["status"] == StageStatus.RUNNING else {})}
                   for stage in stages],
        "glance": glance,
    }
