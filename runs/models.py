"""What the database holds: targets, datasets, one row per pipeline stage, checkpoints, metrics.

Workflows live in services.py; these classes hold fields, constraints and small derived values.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

from runs.pipeline.stage_record import FINISHED_STATUSES, StageRecord, StageStatus  # noqa: F401 - the models' vocabulary


class TargetModel(models.Model):
    """A target (verifier) checkpoint on disk; numbers read from its config.json."""

    name = models.CharField(max_length=200)
    path = models.CharField(max_length=1000, unique=True)
    architecture = models.CharField(max_length=200)
    model_type = models.CharField(max_length=100)
    num_layers = models.PositiveIntegerField()
    hidden_size = models.PositiveIntegerField()
    vocab_size = models.PositiveIntegerField()
    nested_text_config = models.BooleanField(default=False)
    config = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def default_layer_ids(self) -> list[int]:
        from workers.contract.target import default_layer_ids

        return default_layer_ids(self.num_layers)


class Dataset(models.Model):
    """A chat JSONL file (ShareGPT or OpenAI messages) that runs prepare."""

    name = models.CharField(max_length=200)
    path = models.CharField(max_length=1000, unique=True)
    size_bytes = models.BigIntegerField(default=0)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("runs:dataset_detail", args=[self.pk])


class DatasetSample(models.Model):
    """One conversation of a dataset, for curation: excluded ones are skipped by later preparations."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="samples")
    sample_id = models.CharField(max_length=200, help_text="the row's id, or its 0-based line index")
    line = models.PositiveIntegerField()
    num_turns = models.PositiveIntegerField()
    num_chars = models.PositiveIntegerField(db_index=True)
    preview = models.TextField(blank=True)
    excluded = models.BooleanField(default=False, db_index=True)
    tags = models.CharField(max_length=500, blank=True, help_text="comma-separated")
    notes = models.TextField(blank=True)
    # sha256 of the conversation (workers.contract.chats.content_hash): curation follows it when a row
    # without an "id" moves to another line. "" until a catalogue pass after migration 0018 fills it.
    content_hash = models.CharField(max_length=64, blank=True, db_index=True)

    class Meta:
        ordering = ["dataset", "line"]
        constraints = [models.UniqueConstraint(fields=["dataset", "sample_id"], name="unique_sample_id")]

    def __str__(self) -> str:
        return f"{self.dataset.name}#{self.sample_id}"


class CurationAction(models.Model):
    """Who changed which samples, when, and how."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True)
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="curation_actions")
    action = models.CharField(max_length=50)
    sample_ids = models.JSONField(default=list)
    detail = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class PipelineRun(models.Model):
    """One launch: prepare -> extract -> vocab -> train, each stage a row of its own."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="pipeline_runs")
    name = models.CharField(max_length=200, blank=True)
    target = models.ForeignKey(TargetModel, on_delete=models.PROTECT, related_name="runs")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="runs")
    config = models.JSONField(default=dict)
    output_dir = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:run_detail", args=[self.pk])


class PendingEnqueue(models.Model):
    """Work written to the database but not yet handed to the broker (an outbox): created in the
    same transaction as the run, deleted once the broker took the message, retried while it is down."""

    class Kind(models.TextChoices):
        PIPELINE = "pipeline"
        EVALUATION = "evaluation"
        CATALOGUE = "catalogue", "dataset catalogue"
        VERIFY = "verify", "extraction verification"
        SERVE_CHECK = "serve_check", "vLLM serve check"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    object_id = models.PositiveIntegerField(help_text="the run's, the evaluation's or the job's id")
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]


class StageAttempt(models.Model):
    """One execution of a stage's row: where and when it ran, how it ended, its log. The stage's row
    holds the latest state; a retry adds an attempt and keeps the earlier ones."""

    run = models.ForeignKey(PipelineRun, on_delete=models.CASCADE, null=True, blank=True, related_name="attempts")
    stage = models.CharField(max_length=20)
    record_id = models.PositiveIntegerField(help_text="the stage row's id (Preparation, ExtractStage, ...)")
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=StageStatus.choices, default=StageStatus.RUNNING)
    error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)

    class Meta:
        ordering = ["started_at", "id"]
        constraints = [models.UniqueConstraint(fields=["stage", "record_id", "number"], name="unique_attempt_number")]
        indexes = [models.Index(fields=["stage", "record_id"], name="attempt_stage_record")]

    @property
    def seconds(self) -> float | None:
        from django.utils import timezone

        return ((self.finished_at or timezone.now()) - self.started_at).total_seconds()


class Preparation(StageRecord):
    """Tokenized chats with loss masks, in speculators 0.9's prepared layout."""

    run = models.OneToOneField(PipelineRun, on_delete=models.CASCADE, related_name="preparation")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="preparations")
    max_seq_len = models.PositiveIntegerField()
    num_conversations = models.PositiveIntegerField(null=True, blank=True)
    num_rows = models.PositiveIntegerField(null=True, blank=True)
    num_skipped = models.PositiveIntegerField(null=True, blank=True)
    total_tokens = models.BigIntegerField(null=True, blank=True)
    loss_tokens = models.BigIntegerField(null=True, blank=True)
    length_histogram = models.JSONField(default=dict, blank=True)
    token_freq_path = models.CharField(max_length=1000, blank=True)
    # What preparation left out, and why: shown as warnings on the run page and in the summary.
    num_excluded = models.PositiveIntegerField(null=True, blank=True, help_text="conversations excluded by curation")
    num_without_assistant = models.PositiveIntegerField(null=True, blank=True, help_text="conversations with no row")
    num_turns_dropped = models.PositiveIntegerField(null=True, blank=True, help_text="assistant turns not trainable")
    num_truncated_rows = models.PositiveIntegerField(null=True, blank=True, help_text="rows cut at max_seq_len")
    truncated_loss_tokens = models.BigIntegerField(null=True, blank=True, help_text="supervised tokens cut off")
    mask_source = models.CharField(max_length=30, blank=True)


class ExtractStage(StageRecord):
    """The extract stage of a run: what it plans to capture, and what its execution measured. The
    hidden states it wrote are its Extraction (`extraction`), created when it succeeds."""

    run = models.OneToOneField(PipelineRun, on_delete=models.CASCADE, related_name="extract_stage")
    target = models.ForeignKey(TargetModel, on_delete=models.PROTECT, related_name="extract_stages")
    layer_ids = models.JSONField(default=list, help_text="the hidden-state ids the stage captures")
    device = models.CharField(max_length=100, blank=True)
    model_load_seconds = models.FloatField(null=True, blank=True)
    forward_seconds = models.FloatField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return f"extract stage of run {self.run_id}"


class Extraction(models.Model):
    """Hidden states of the target at chosen layers, on disk: written by a run's extract stage
    (`produced_by`) or imported by a user (`imported_at`, `imported_by`, `imported_from`), never both."""

    target = models.ForeignKey(TargetModel, on_delete=models.PROTECT, related_name="extractions")
    path = models.CharField(max_length=1000, help_text="the extraction's directory")
    layer_ids = models.JSONField(default=list)
    layer_id_convention = models.CharField(max_length=50, default="hf_hidden_states_index")
    num_samples = models.PositiveIntegerField(null=True, blank=True)
    total_tokens = models.BigIntegerField(null=True, blank=True)
    hidden_size = models.PositiveIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=30, blank=True)
    bytes_on_disk = models.BigIntegerField(null=True, blank=True)
    layout = models.CharField(max_length=30, blank=True, help_text="flat_v1, speculators_v04 or speculators_09")
    created_at = models.DateTimeField(auto_now_add=True)
    produced_by = models.OneToOneField(ExtractStage, on_delete=models.CASCADE, null=True, blank=True,
                                       related_name="extraction")
    imported_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="imported_extractions")
    imported_at = models.DateTimeField(null=True, blank=True)
    imported_from = models.CharField(max_length=1000, blank=True, help_text="the path the user gave")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(produced_by__isnull=False, imported_at__isnull=True, imported_by__isnull=True)
                    | models.Q(produced_by__isnull=True, imported_at__isnull=False)
                ),
                name="extraction_produced_or_imported",
            )
        ]

    def __str__(self) -> str:
        return f"extraction {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:extraction_detail", args=[self.pk])

    @property
    def run(self) -> PipelineRun | None:
        """The run whose extract stage wrote it; None when imported."""
        return self.produced_by.run if self.produced_by_id else None

    @property
    def latest_verification(self) -> "Verification | None":
        return self.verifications.order_by("-created_at", "-id").first()

    @property
    def bytes_per_token(self) -> float | None:
        if not self.bytes_on_disk or not self.total_tokens:
            return None
        return self.bytes_on_disk / self.total_tokens

    @property
    def floor_bytes_per_token(self) -> int | None:
        """L x H elements of the stored dtype per token (bfloat16, the layouts' default, when unrecorded)."""
        from workers.contract.dtypes import floor_bytes_per_token

        return floor_bytes_per_token(len(self.layer_ids or []), self.hidden_size, self.dtype or "bfloat16")


class Manifest(models.Model):
    """The data_config.json an extraction wrote or came with, kept verbatim."""

    extraction = models.OneToOneField(Extraction, on_delete=models.CASCADE, related_name="manifest")
    path = models.CharField(max_length=1000)
    format_version = models.CharField(max_length=20)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)


class Verification(models.Model):
    """What an extraction's files measured against what its manifest claims, check by check."""

    extraction = models.ForeignKey(Extraction, on_delete=models.CASCADE, related_name="verifications")
    full = models.BooleanField(default=False, help_text="values scanned, not only headers")
    passed = models.BooleanField()
    layout = models.CharField(max_length=30)
    checks = models.JSONField(default=list)
    report = models.JSONField(default=dict)
    seconds = models.FloatField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def failures(self) -> list[dict]:
        return [c for c in self.checks if c["verdict"] == "fail"]


class VerificationOverride(models.Model):
    """A reviewer's written decision to train on an extraction despite its failed verification."""

    verification = models.ForeignKey(Verification, on_delete=models.CASCADE, related_name="overrides")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)


class VocabMapping(StageRecord):
    """d2t/t2d: which target tokens the draft can propose."""

    run = models.OneToOneField(PipelineRun, on_delete=models.CASCADE, related_name="vocab_mapping")
    draft_vocab_size = models.PositiveIntegerField()
    target_vocab_size = models.PositiveIntegerField()
    distinct_tokens = models.PositiveIntegerField(null=True, blank=True)
    coverage = models.FloatField(null=True, blank=True)
    filler_tokens = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="draft entries filled with ids the data never used")
    d2t_path = models.CharField(max_length=1000, blank=True)
    t2d_path = models.CharField(max_length=1000, blank=True)


class TrainingRun(StageRecord):
    """Training of the EAGLE-3 draft; its curves are MetricSeries, its outputs Checkpoints."""

    run = models.OneToOneField(PipelineRun, on_delete=models.CASCADE, related_name="training_run")
    epochs = models.PositiveIntegerField()
    lr = models.FloatField()
    ttt_steps = models.PositiveIntegerField()
    steps = models.PositiveIntegerField(null=True, blank=True)
    train_tokens = models.BigIntegerField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    best_epoch = models.PositiveIntegerField(null=True, blank=True)
    device = models.CharField(max_length=100, blank=True)
    tokens_per_step = models.PositiveIntegerField(null=True, blank=True, help_text="packing budget actually used")
    loss_tokens_available = models.BigIntegerField(null=True, blank=True, help_text="supervised tokens in the train split")
    loss_tokens_trained = models.BigIntegerField(null=True, blank=True, help_text="of those, reached the loss in the last epoch")
    loss_tokens_per_epoch = models.JSONField(default=list, blank=True)
    rows_unusable = models.PositiveIntegerField(null=True, blank=True, help_text="rows too short to train on")
    split = models.JSONField(default=dict, blank=True, help_text="how rows were split into train and validation")
    resumed_from_step = models.PositiveIntegerField(null=True, blank=True,
                                                    help_text="the step a retried training continued from (0: from scratch)")


class Checkpoint(models.Model):
    """A draft in speculators' format: trained by a run here (`training_run`), or imported
    (`training_run` empty, `imported_at` and `imported_by` set), never both."""

    training_run = models.ForeignKey(
        TrainingRun, on_delete=models.CASCADE, null=True, blank=True, related_name="checkpoints"
    )
    epoch = models.PositiveIntegerField()
    path = models.CharField(max_length=1000)
    imported_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="imported_checkpoints")
    imported_at = models.DateTimeField(null=True, blank=True)
    verifier_path = models.CharField(max_length=1000, blank=True)
    aux_layer_ids = models.JSONField(default=list, blank=True)
    draft_vocab_size = models.PositiveIntegerField(null=True, blank=True)
    # Tokens the draft proposes per step, read from its config.json once when it is registered;
    # empty when that file was unreadable then (the serve command reads it again).
    speculative_tokens = models.PositiveIntegerField(null=True, blank=True)
    train_loss = models.FloatField(null=True, blank=True)
    val_loss = models.FloatField(null=True, blank=True)
    val_metrics = models.JSONField(default=dict, blank=True)
    is_best = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["epoch"]
        constraints = [
            models.UniqueConstraint(fields=["training_run", "epoch"], name="unique_checkpoint_epoch"),
            models.CheckConstraint(
                condition=(
                    models.Q(training_run__isnull=False, imported_at__isnull=True, imported_by__isnull=True)
                    | models.Q(training_run__isnull=True, imported_at__isnull=False)
                ),
                name="checkpoint_trained_or_imported",
            ),
        ]

    def get_absolute_url(self) -> str:
        return reverse("runs:checkpoint_detail", args=[self.pk])

    def __str__(self) -> str:
        if self.training_run_id is None:
            return f"imported {self.path}"
        return f"epoch {self.epoch} of run {self.training_run.run_id}"

    @property
    def simulated_tau(self) -> float | None:
        """Acceptance length implied by this checkpoint's validation accuracies."""
        from workers.contract.acceptance import cond_accuracies, simulated_tau

        return simulated_tau(cond_accuracies(self.val_metrics))


class Evaluation(StageRecord):
    """Acceptance length of a checkpoint, measured by speculative decoding with its target.

    The pipeline's last stage (`run` set, the run's best checkpoint) or asked for on any registered
    checkpoint (`run` empty)."""

    run = models.OneToOneField(PipelineRun, on_delete=models.CASCADE, null=True, blank=True, related_name="evaluation")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, null=True, blank=True,
                                   related_name="evaluations")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    prompts_path = models.CharField(max_length=1000, blank=True, help_text="empty: the run's validation conversations")
    max_prompts = models.PositiveIntegerField(default=32)
    max_new_tokens = models.PositiveIntegerField(default=64)
    num_speculative_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the checkpoint's own")
    prompt_source = models.CharField(max_length=1000, blank=True)
    num_prompts = models.PositiveIntegerField(null=True, blank=True)
    tau = models.FloatField(null=True, blank=True, help_text="tokens per target forward")
    acceptance_per_position = models.JSONField(default=list, blank=True)
    new_tokens = models.PositiveIntegerField(null=True, blank=True)
    verify_forwards = models.PositiveIntegerField(null=True, blank=True)
    output_matches_greedy = models.BooleanField(null=True, blank=True)
    mismatched_prompts = models.JSONField(default=list, blank=True)
    spec_tokens_per_s = models.FloatField(null=True, blank=True)
    greedy_tokens_per_s = models.FloatField(null=True, blank=True)
    speedup = models.FloatField(null=True, blank=True)
    device = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["-id"]


class Review(models.Model):
    """A comment, approval or change request on a run, an extraction or a checkpoint."""

    class Decision(models.TextChoices):
        COMMENT = "comment"
        APPROVE = "approve"
        REQUEST_CHANGES = "request_changes", "request changes"

    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reviews")
    decision = models.CharField(max_length=20, choices=Decision.choices, default=Decision.COMMENT)
    text = models.TextField()
    run = models.ForeignKey(PipelineRun, on_delete=models.CASCADE, null=True, blank=True, related_name="reviews")
    extraction = models.ForeignKey(Extraction, on_delete=models.CASCADE, null=True, blank=True, related_name="reviews")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, null=True, blank=True, related_name="reviews")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(run__isnull=False, extraction__isnull=True, checkpoint__isnull=True)
                    | models.Q(run__isnull=True, extraction__isnull=False, checkpoint__isnull=True)
                    | models.Q(run__isnull=True, extraction__isnull=True, checkpoint__isnull=False)
                ),
                name="review_has_exactly_one_subject",
            )
        ]


# Curves live in their own module (chunked series); imported here so that Django registers them.
from runs.tracking.models import MetricChunk, MetricSeries  # noqa: E402,F401
from runs.review.tag_models import RunTag  # noqa: E402,F401
from runs.pipeline.job_models import DatasetCatalogue, ServeCheck, VerificationRequest  # noqa: E402,F401
from runs.fleet.models import Worker  # noqa: E402,F401
