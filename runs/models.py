"""What the database holds, by part: every model of the app, imported here so Django sees one app
`runs` and `from runs.models import X` works for any of them. Each part keeps its own models:
data (targets, datasets, extractions), pipeline (runs, stage rows, attempts, jobs), checkpoints
(checkpoints, evaluations), tracking (curves), review (reviews, tags), fleet (workers), sweeps (sweeps and
their runs).

Workflows live in each part's services; the models hold fields, constraints and small derived values.
"""
from runs.alerts.models import Alert, AlertDelivery, AlertNotice, AlertRule, StageWatch  # noqa: F401
from runs.api.models import AccountSettings, ApiAuditEntry, ApiToken, LaunchIdempotencyKey  # noqa: F401
from runs.checkpoints.models import Checkpoint, Evaluation  # noqa: F401
from runs.data.models import (  # noqa: F401
    CurationAction,
    Dataset,
    DatasetSample,
    EvalSuite,
    Extraction,
    Manifest,
    TargetModel,
    Verification,
    VerificationOverride,
)
from runs.fleet.models import Worker  # noqa: F401
from runs.pipeline.jobs.models import (  # noqa: F401
    DatasetCatalogue,
    DatasetRegeneration,
    ServeCheck,
    VerificationRequest,
)
from runs.pipeline.nodes.models import TrainingNode  # noqa: F401
from runs.pipeline.models import (  # noqa: F401
    ExtractStage,
    PendingEnqueue,
    PipelineRun,
    Preparation,
    StageAttempt,
    TrainingRun,
    VocabMapping,
)
from runs.pipeline.shards.models import StageShard  # noqa: F401
# the models' vocabulary
from runs.pipeline.lifecycle.stage_record import FINISHED_STATUSES, StageRecord, StageStatus  # noqa: F401
from runs.projects.models import Project, ProjectMember  # noqa: F401
from runs.reports.models import Report, ReportVersion  # noqa: F401
from runs.review.models import Review, RunTag  # noqa: F401
from runs.saved_views.models import SavedView  # noqa: F401
from runs.sweeps.models import Sweep, SweepRun  # noqa: F401
from runs.tracking.models import MetricChunk, MetricSeries  # noqa: F401
