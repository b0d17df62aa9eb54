from django.contrib import admin

import runs.alerts.admin  # noqa: F401 - alert rules, firings, notices, deliveries
import runs.api.admin  # noqa: F401 - tokens, the API's audit trail, account settings
import runs.data.admin  # noqa: F401 - datasets' samples, their curation log
import runs.projects.admin  # noqa: F401 - projects, their members
import runs.reports.admin  # noqa: F401 - reports and their versions
import runs.saved_views.admin  # noqa: F401 - saved views
import runs.sweeps.admin  # noqa: F401 - sweeps and their runs
from runs.admin_bases import InternalAdmin, NoAddAdmin
from runs.checkpoints.models import CheckpointGenerations
from runs.fleet.models import Worker
from runs.pipeline.shards.models import StageShard
from runs.pipeline.jobs.models import DatasetCatalogue, DatasetRegeneration, DemoBuild, ServeCheck, VerificationRequest
from runs.checkpoints.models import Checkpoint, Evaluation
from runs.pipeline.nodes.models import TrainingNode
from runs.data.models import (
    Dataset,
    EvalSuite,
    Extraction,
    Manifest,
    TargetModel,
    Verification,
    VerificationOverride,
)
from runs.pipeline.models import (
    ExtractStage,
    PendingEnqueue,
    PipelineRun,
    Preparation,
    StageAttempt,
    TrainingRun,
    VocabMapping,
)
from runs.review.models import RunTag, Review
from runs.tracking.models import MetricChunk, MetricSeries
from runs.tracking.runs_list.run_search import searched

STAGE_FIELDS = ("status", "started_at", "finished_at", "progress_done", "progress_total", "worker")


@admin.register(TargetModel)
class TargetModelAdmin(NoAddAdmin):
    list_display = ("name", "architecture", "num_layers", "hidden_size", "vocab_size", "path", "created_at")
    list_filter = ("architecture", "model_type", "nested_text_config")
    search_fields = ("name", "path", "architecture")


@admin.register(Dataset)
class DatasetAdmin(NoAddAdmin):
    list_display = ("name", "path", "size_bytes", "created_at")
    search_fields = ("name", "path", "notes")


@admin.register(EvalSuite)
class EvalSuiteAdmin(NoAddAdmin):
    """Registered by the launch that first names it with a path (runs.data.suites checks the file there); curated
    here: its notes, and `retired` to refuse it to new runs. Its name and path stay: runs measured on them say so."""
    list_display = ("name", "path", "size_bytes", "retired", "created_by", "created_at")
    list_select_related = ("created_by",)  # nullable: not followed by Django's own select_related()
    list_filter = ("retired",)
    search_fields = ("name", "path", "notes")
    readonly_fields = ("name", "path", "size_bytes", "created_by", "created_at")


class StageInline(admin.StackedInline):
    extra = 0
    can_delete = False
    readonly_fields = ("status", "started_at", "finished_at", "progress_done", "progress_total", "worker", "error")
    fields = readonly_fields


class PreparationInline(StageInline):
    model = Preparation


class ExtractStageInline(StageInline):
    model = ExtractStage


class VocabMappingInline(StageInline):
    model = VocabMapping


class TrainingRunInline(StageInline):
    model = TrainingRun


@admin.register(PipelineRun)
class PipelineRunAdmin(NoAddAdmin):
    list_display = ("id", "name", "owner", "target", "dataset", "created_at")
    # Named: Django's own select_related() follows no nullable key (a run trained elsewhere has no target or
    # dataset), and the list read both per row (tests/views/admin/test_admin_list_queries.py).
    list_select_related = ("owner", "target", "dataset")
    list_filter = ("target", "owner", "created_at")
    search_fields = ("name", "notes")  # shows the search box; get_search_results answers it
    # No date_hierarchy: its links read the distinct days (or years) of every run, 40 ms at 100,000 runs on each
    # open; list_filter's created_at offers today, the past 7 days, this month and this year without a query. Nor a
    # second count of all runs beside a filtered list's (Django's show_full_result_count).
    show_full_result_count = False
    inlines = [PreparationInline, ExtractStageInline, VocabMappingInline, TrainingRunInline]
    # A run's settings were checked at launch (backends, GPU counts, layer ids against the target, what
    # the live workers take); an edit here would bypass all of it. Launch a copy to change them.
    readonly_fields = ("config",)

    def get_search_results(self, request, queryset, search_term):
        """What the runs list's search box finds (its name's or notes' words, its target's, dataset's or owner's
        name, a tag, its id), from the indexes that serve it: Django's search of these fields joined them and read
        every run (420 ms at 100,000 runs)."""
        term = search_term.strip()
        return (searched(queryset, term) if term else queryset), False


class StageAdmin(InternalAdmin):
    list_filter = ("status",)
    readonly_fields = ("log_tail", "error")


@admin.register(Preparation)
class PreparationAdmin(StageAdmin):
    list_display = ("id", "run", "dataset", *STAGE_FIELDS[:3], "num_rows", "total_tokens", "loss_tokens")
    search_fields = ("dataset__name", "run__name")


@admin.register(ExtractStage)
class ExtractStageAdmin(StageAdmin):
    list_display = ("id", "run", "target", *STAGE_FIELDS[:3], "layer_ids", "device", "tokens_per_second")
    search_fields = ("target__name", "out_dir", "run__name")


@admin.register(Extraction)
class ExtractionAdmin(NoAddAdmin):
    list_display = ("id", "produced_by", "imported_by", "imported_at", "target", "layer_ids", "num_samples",
                    "total_tokens", "dtype", "path")
    list_filter = ("target", "dtype", "layer_id_convention", "layout")
    list_select_related = ("produced_by", "imported_by", "target")
    search_fields = ("target__name", "path", "produced_by__run__name", "imported_from")


@admin.register(Manifest)
class ManifestAdmin(InternalAdmin):
    list_display = ("id", "extraction", "format_version", "path", "created_at")
    list_filter = ("format_version",)
    search_fields = ("path",)


@admin.register(VocabMapping)
class VocabMappingAdmin(StageAdmin):
    list_display = ("id", "run", *STAGE_FIELDS[:3], "draft_vocab_size", "target_vocab_size", "coverage")


@admin.register(TrainingRun)
class TrainingRunAdmin(StageAdmin):
    list_display = ("id", "run", *STAGE_FIELDS[:3], "epochs", "lr", "ttt_steps", "steps", "best_epoch",
                    "loss_tokens_trained", "loss_tokens_available")


@admin.register(PendingEnqueue)
class PendingEnqueueAdmin(NoAddAdmin):
    """The outbox: listed, so that staff see what waits and why, and delete a row that should not be sent."""

    list_display = ("id", "kind", "object_id", "created_at", "attempts", "last_error")
    list_filter = ("kind",)

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(StageAttempt)
class StageAttemptAdmin(InternalAdmin):
    list_display = ("id", "run", "stage", "number", "outcome", "worker", "started_at", "finished_at")
    list_select_related = ("run",)  # nullable: not followed by Django's own select_related()
    list_filter = ("stage", "outcome")
    readonly_fields = ("log_tail", "error")


@admin.register(StageShard)
class StageShardAdmin(InternalAdmin):
    """One shard of a stage split over many workers: written by the workers only."""

    list_display = ("id", "run", "stage", "record_id", "index", "row_start", "row_stop", "status", "worker",
                    "attempts", "rows_done")
    list_select_related = ("run",)  # nullable: not followed by Django's own select_related()
    list_filter = ("stage", "status")
    readonly_fields = ("log_tail", "error", "result")


@admin.register(DatasetCatalogue)
class DatasetCatalogueAdmin(StageAdmin):
    list_display = ("id", "dataset", *STAGE_FIELDS, "samples_added", "samples_total")
    list_select_related = ("dataset",)


@admin.register(DemoBuild)
class DemoBuildAdmin(StageAdmin):
    """make demo's target build: internal, read-only; staff see its progress and error here."""

    list_display = ("id", "out_dir", *STAGE_FIELDS, "train_steps", "initial_loss", "final_loss")


@admin.register(VerificationRequest)
class VerificationRequestAdmin(StageAdmin):
    list_display = ("id", "extraction", "full", *STAGE_FIELDS, "verification")
    list_select_related = ("extraction", "verification")


@admin.register(ServeCheck)
class ServeCheckAdmin(StageAdmin):
    list_display = ("id", "checkpoint", "evaluation", *STAGE_FIELDS[:3], "vllm_tau_emitted", "tau", "tau_difference",
                    "vllm_output_matches_greedy", "vllm_version")
    list_select_related = ("checkpoint__training_run", "evaluation")  # Checkpoint.__str__ reads its training


@admin.register(DatasetRegeneration)
class DatasetRegenerationAdmin(StageAdmin):
    list_display = ("id", "source", "target", "backend", "temperature", "max_new_tokens", *STAGE_FIELDS[:3], "dataset",
                    "conversations", "turns_regenerated", "replies_cut", "failures")
    list_select_related = ("source", "target", "dataset")
    list_filter = ("backend", "status")


@admin.register(Evaluation)
class EvaluationAdmin(StageAdmin):
    list_display = ("id", "run", "checkpoint", *STAGE_FIELDS[:3], "tau", "output_matches_greedy", "num_prompts")
    list_select_related = ("run", "checkpoint__training_run")  # Checkpoint.__str__ reads its training


@admin.register(CheckpointGenerations)
class CheckpointGenerationsAdmin(InternalAdmin):
    """A measurement's replies token by token (the checkpoint page's generations table)."""
    list_display = ("id", "checkpoint", "evaluation", "num_speculative_tokens", "tokens_cap", "created_at")
    list_select_related = ("checkpoint__training_run", "evaluation")  # Checkpoint.__str__ reads its training


@admin.register(Checkpoint)
class CheckpointAdmin(NoAddAdmin):
    list_display = ("id", "training_run", "epoch", "val_loss", "train_loss", "is_best", "imported_by", "imported_at",
                    "path")
    list_select_related = ("training_run", "imported_by")  # both nullable: not followed by Django's own
    list_filter = ("is_best", ("training_run", admin.EmptyFieldListFilter))
    search_fields = ("path",)


@admin.register(MetricSeries)
class MetricSeriesAdmin(InternalAdmin):
    list_display = ("training_run", "split", "key", "num_points", "last_step", "last_value", "min_value", "min_step",
                    "num_refused")
    list_filter = ("split",)
    search_fields = ("key",)
    # The points are binary chunks: the run page's curve export gives them as CSV or JSON.
    readonly_fields = [f.name for f in MetricSeries._meta.fields]


@admin.register(RunTag)
class RunTagAdmin(admin.ModelAdmin):
    list_display = ("name",)
    search_fields = ("name",)
    filter_horizontal = ("runs",)


@admin.register(MetricChunk)
class MetricChunkAdmin(InternalAdmin):
    list_display = ("series", "first_step", "last_step", "num_points")
    fields = readonly_fields = ("series", "first_step", "last_step", "num_points")  # the arrays are binary


@admin.register(Verification)
class VerificationAdmin(NoAddAdmin):
    list_display = ("id", "extraction", "passed", "full", "layout", "seconds", "created_by", "created_at")
    list_select_related = ("extraction", "created_by")
    list_filter = ("passed", "full", "layout")
    search_fields = ("extraction__path",)
    readonly_fields = ("checks", "report")

    def has_change_permission(self, request, obj=None):
        return False  # a verification's result is what it measured; an override says why it is set aside


@admin.register(Review)
class ReviewAdmin(admin.ModelAdmin):
    list_display = ("created_at", "author", "decision", "run", "extraction", "checkpoint", "text")
    # A checkpoint names its run through its training (Checkpoint.__str__).
    list_select_related = ("author", "run", "extraction", "checkpoint__training_run")
    list_filter = ("decision", "author")
    search_fields = ("text", "author__username")


@admin.register(VerificationOverride)
class VerificationOverrideAdmin(NoAddAdmin):
    list_display = ("created_at", "reviewer", "verification", "reason")
    search_fields = ("reason", "reviewer__username")


@admin.register(Worker)
class WorkerAdmin(NoAddAdmin):
    """Rows the workers' heartbeats write (the /workers/ page reads them); delete one that is gone for good."""

    list_display = ("name", "hostname", "last_seen", "stopped_at", "started_at")
    search_fields = ("name", "hostname")


@admin.register(TrainingNode)
class TrainingNodeAdmin(InternalAdmin):
    """Who held which rank of a training across nodes (runs.pipeline.nodes.services): internal, read-only."""

    list_display = ("id", "training", "attempt", "rank", "worker", "status", "started_at", "finished_at")
    list_filter = ("status",)
    readonly_fields = ("log_tail", "error")
