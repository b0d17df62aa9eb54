"""Handing work to the workers, by task name: the web tier never imports the tasks (nor, through
them, torch), and nothing here imports back into the code that enqueues."""
from __future__ import annotations

from celery import chain

from eagle3web.celery import celery_app
from runs.pipeline import STAGES, STAGES_BY_NAME

STAGE_TASK = "eagle3web.stage"  # workers.tasks.stage_task
EVALUATION_TASK = "eagle3web.evaluate_checkpoint"  # workers.tasks.evaluation_task


def pipeline_enqueue(*, run_id: int) -> None:
    """One chain per run; each stage goes to its own queue (cpu or gpu)."""
    chain(*[celery_app.signature(STAGE_TASK, args=(stage.name, run_id), immutable=True, queue=stage.queue)
            for stage in STAGES]).apply_async()


def evaluation_enqueue(*, evaluation_id: int) -> None:
    celery_app.send_task(EVALUATION_TASK, args=[evaluation_id], queue=STAGES_BY_NAME["evaluate"].queue)
