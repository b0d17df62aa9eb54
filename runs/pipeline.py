"""The five stages of a pipeline run, in order, with the model that records each and the queue it runs on."""
from __future__ import annotations

from dataclasses import dataclass

from runs.models import Evaluation, ExtractStage, Preparation, StageRecord, TrainingRun, VocabMapping


@dataclass(frozen=True)
class StageKind:
    name: str  # used in task names, URLs and the CLI's JSON
    label: str
    model: type[StageRecord]
    related_name: str  # attribute on PipelineRun
    queue: str


STAGES = (
    StageKind("prepare", "Prepare dataset", Preparation, "preparation", "cpu"),
    StageKind("extract", "Extract hidden states", ExtractStage, "extract_stage", "gpu"),
    StageKind("vocab", "Build draft vocabulary", VocabMapping, "vocab_mapping", "cpu"),
    StageKind("train", "Train draft", TrainingRun, "training_run", "gpu"),
    StageKind("evaluate", "Measure acceptance", Evaluation, "evaluation", "gpu"),
)
STAGES_BY_NAME = {stage.name: stage for stage in STAGES}
