"""The five stages of a pipeline run, in order, with the model that records each and the queue it runs on;
and the jobs users start outside a run, which workers run the same way (lease, progress, attempts)."""
from __future__ import annotations

from dataclasses import dataclass

from runs.pipeline.jobs.models import DatasetCatalogue, DatasetRegeneration, DemoBuild, ServeCheck, VerificationRequest
from runs.checkpoints.models import Evaluation
from runs.pipeline.models import ExtractStage, Preparation, TrainingRun, VocabMapping
from runs.pipeline.lifecycle import stage_record
from runs.pipeline.lifecycle.stage_record import StageRecord


@dataclass(frozen=True)
class StageKind:
    name: str  # used in task names, URLs and the CLI's JSON
    label: str
    model: type[StageRecord]
    related_name: str  # attribute on PipelineRun ("" for a job)
    queue: str

    @property
    def is_job(self) -> bool:
        """One of the JOBS users start outside a run: no run to follow on in (or to cancel when it
        fails), and it reads files and the database only, so its worker needs no torch."""
        return not self.related_name


STAGES = (
    StageKind("prepare", "Prepare dataset", Preparation, "preparation", "cpu"),
    StageKind("extract", "Extract hidden states", ExtractStage, "extract_stage", "gpu"),
    StageKind("vocab", "Build draft vocabulary", VocabMapping, "vocab_mapping", "cpu"),
    StageKind("train", "Train draft", TrainingRun, "training_run", "gpu"),
    StageKind("evaluate", "Measure acceptance", Evaluation, "evaluation", "gpu"),
)
JOBS = (
    StageKind("catalogue", "Catalogue dataset", DatasetCatalogue, "", "cpu"),
    StageKind("verify", "Verify extraction", VerificationRequest, "", "cpu"),
    # vLLM on one device (its CPU build, or one GPU); a check of a target spread over n GPUs goes to
    # vllm.<n> (runs.pipeline.dispatch.queue.job_queue).
    StageKind("serve_check", "Check with vLLM", ServeCheck, "", "vllm.1"),
    # Its backend's queue (runs.pipeline.dispatch.queue.job_queue): "gpu" for transformers on one device, vllm.<n>.
    StageKind("regenerate", "Regenerate replies", DatasetRegeneration, "", "gpu"),
    # `make demo`'s small target, trained on the CPU (it sets its own torch threads).
    StageKind("demo_build", "Build the demo target", DemoBuild, "", "cpu"),
)
JOB_NAMES = frozenset(job.name for job in JOBS)
# Every kind of row a worker runs, by name: the stages of runs and the jobs.
STAGES_BY_NAME = {stage.name: stage for stage in (*STAGES, *JOBS)}
stage_record.NAMES_BY_MODEL.update({stage.model: stage.name for stage in STAGES_BY_NAME.values()})
