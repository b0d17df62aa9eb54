from django.contrib import admin

from runs.models import (
    Checkpoint,
    Dataset,
    Extraction,
    Manifest,
    MetricPoint,
    PipelineRun,
    Preparation,
    TargetModel,
    TrainingRun,
    Verification,
    VocabMapping,
)

STAGE_FIELDS = ("status", "started_at", "finished_at", "progress_done", "progress_total", "worker")


@admin.register(TargetModel)
class TargetModelAdmin(admin.ModelAdmin):
    list_display = ("name", "architecture", "num_layers", "hidden_size", "vocab_size", "path", "created_at")
    list_filter = ("architecture", "model_type", "nested_text_config")
    search_fields = ("name", "path", "architecture")


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "path", "size_bytes", "created_at")
    search_fields = ("name", "path", "notes")


class StageInline(admin.StackedInline):
    extra = 0
    can_delete = False
    readonly_fields = ("status", "started_at", "finished_at", "progress_done", "progress_total", "worker", "error")
    fields = readonly_fields


class PreparationInline(StageInline):
    model = Preparation


class ExtractionInline(StageInline):
    model = Extraction
    fk_name = "run"


class VocabMappingInline(StageInline):
    model = VocabMapping


class TrainingRunInline(StageInline):
    model = TrainingRun


@admin.register(PipelineRun)
class PipelineRunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "target", "dataset", "created_at")
    list_filter = ("target", "owner", "created_at")
    search_fields = ("name", "target__name", "dataset__name", "owner__username")
    date_hierarchy = "created_at"
    inlines = [PreparationInline, ExtractionInline, VocabMappingInline, TrainingRunInline]


class StageAdmin(admin.ModelAdmin):
    list_filter = ("status",)
    readonly_fields = ("log_tail", "error")


@admin.register(Preparation)
class PreparationAdmin(StageAdmin):
    list_display = ("id", "run", "dataset", *STAGE_FIELDS[:3], "num_rows", "total_tokens", "loss_tokens")
    search_fields = ("dataset__name", "run__name")


@admin.register(Extraction)
class ExtractionAdmin(StageAdmin):
    list_display = ("id", "run", "target", *STAGE_FIELDS[:3], "layer_ids", "num_samples", "total_tokens", "dtype")
    list_filter = ("status", "target", "dtype", "layer_id_convention")
    search_fields = ("target__name", "out_dir", "run__name")


@admin.register(Manifest)
class ManifestAdmin(admin.ModelAdmin):
    list_display = ("id", "extraction", "format_version", "path", "created_at")
    list_filter = ("format_version",)
    search_fields = ("path",)


@admin.register(VocabMapping)
class VocabMappingAdmin(StageAdmin):
    list_display = ("id", "run", *STAGE_FIELDS[:3], "draft_vocab_size", "target_vocab_size", "coverage")


@admin.register(TrainingRun)
class TrainingRunAdmin(StageAdmin):
    list_display = ("id", "run", *STAGE_FIELDS[:3], "epochs", "lr", "ttt_steps", "steps", "best_epoch")


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("id", "training_run", "epoch", "val_loss", "train_loss", "is_best", "path")
    list_filter = ("is_best",)
    search_fields = ("path",)


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("training_run", "split", "key", "step", "epoch", "value")
    list_filter = ("split", "key")
    search_fields = ("key",)


@admin.register(Verification)
class VerificationAdmin(admin.ModelAdmin):
    list_display = ("id", "extraction", "passed", "full", "layout", "seconds", "created_by", "created_at")
    list_filter = ("passed", "full", "layout")
    search_fields = ("extraction__out_dir",)
    readonly_fields = ("checks", "report")
