"""What a run's extract stage leaves when it succeeds, without running it (the stage needs a model)."""
from __future__ import annotations

from django.utils import timezone

from runs.models import Extraction, ExtractStage, PipelineRun, StageStatus


def extraction_written(run: PipelineRun, *, path, **fields) -> Extraction:
    """The run's extract stage marked succeeded, and its Extraction of the files at `path`."""
    stage = run.extract_stage
    ExtractStage.objects.filter(pk=stage.pk).update(status=StageStatus.SUCCEEDED, finished_at=timezone.now(),
                                                    out_dir=str(path))
    return Extraction.objects.create(produced_by=stage, target_id=run.target_id, path=str(path),
                                     layer_ids=fields.pop("layer_ids", stage.layer_ids), **fields)
