"""A pipeline run, its outbox row (PendingEnqueue), its stage attempts and one row per stage.

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

from runs.pipeline.lifecycle.stage_record import StageRecord, StageStatus
from runs.projects.models import default_project_pk


def shown_tau_of(*, external: bool, best_tau: float | None, evaluated_tau: float | None,
                 evaluation_status: str | None) -> float | None:
    """PipelineRun.shown_tau from its parts, for rows read as values (runs.tracking.runs_list.run_table.listed_runs)."""
    if external:
        return None
    if best_tau is not None:
        return best_tau
    return evaluated_tau if evaluation_status == "succeeded" else None


class PipelineRun(models.Model):
    """One launch: prepare -> extract -> vocab -> train, each stage a row of its own.

    Or a run trained elsewhere (`external`, runs.pipeline.launch.external): created through the API with the
    trainer's settings, it has a training row only, which its trainer's client fills (curves,
    checkpoints, its end); nothing of it is ever queued. Its target and dataset are given only when
    the trainer names them."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="pipeline_runs")
    name = models.CharField(max_length=200, blank=True)
    target = models.ForeignKey("runs.TargetModel", on_delete=models.PROTECT, null=True, blank=True, related_name="runs")
    dataset = models.ForeignKey("runs.Dataset", on_delete=models.PROTECT, null=True, blank=True, related_name="runs")
    external = models.BooleanField(default=False, help_text="trained elsewhere; reported through the API")
    # Who sees the run and who may launch beside it (runs.projects.access); found by its notes' words too.
    project = models.ForeignKey("runs.Project", on_delete=models.PROTECT, default=default_project_pk,
                                related_name="runs")
    notes = models.TextField(blank=True)
    archived = models.BooleanField(default=False, help_text="hidden from the runs list unless asked for")
    config = models.JSONField(default=dict)
    output_dir = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Writes to what the run's pages show, to its curves alone, and to its state as the runs list shows it
    # (stage statuses and results, checkpoints; not progress, logs or curves) (runs.pipeline.status.changes): a
    # live page's poll reads these first and answers 304 when they have not moved.
    changes = models.BigIntegerField(default=0, editable=False)
    curve_changes = models.BigIntegerField(default=0, editable=False)
    state_changes = models.BigIntegerField(default=0, editable=False)
    # The runs list's τ, kept from the training's and the evaluate stage's rows (runs.pipeline.status.list_tau).
    list_tau = models.FloatField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.CheckConstraint(
            condition=models.Q(external=True) | models.Q(target__isnull=False, dataset__isnull=False),
            name="pipeline_run_has_target_and_dataset")]
        # state_changes has no index (migration 0037 dropped run_state_changes): the runs list's version reads a
        # change count on PostgreSQL (runs.pipeline.status.changes.runs_list_version), so a bump of it updates the
        # row in place, as progress and curves bump theirs.
        indexes = [
            # The runs list's default page, newest first, and its count of the projects a viewer sees
            # from the index alone (runs.tracking.runs_list.run_table._page_ids; issue 40).
            models.Index(models.F("created_at").desc(), models.F("id").desc(), name="run_newest"),
            # With the id, search's count reads a viewer's runs from the index alone (migration 0033).
            models.Index(fields=["project", "archived", "id"], name="run_project_archived_id")]

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:run_detail", args=[self.pk])

    @property
    def shown_tau(self) -> float | None:
        """The τ the run is known by in lists, sweeps, compare and the API: its best checkpoint's once its rule
        decided (runs.pipeline.best keeps it on the training), else what its evaluate stage measured (the
        trainer's choice); None before that, and for a run trained elsewhere (it reports no τ of ours)."""
        training = getattr(self, "training_run", None)
        evaluation = getattr(self, "evaluation", None)
        return shown_tau_of(external=self.external, best_tau=training.best_tau if training is not None else None,
                            evaluated_tau=evaluation.tau if evaluation is not None else None,
                            evaluation_status=evaluation.status if evaluation is not None else None)


class PendingEnqueue(models.Model):
    """Work written to the database but not yet handed to the broker (an outbox): created in the
    same transaction as the run, deleted once the broker took the message, retried while it is down."""

    class Kind(models.TextChoices):
        PIPELINE = "pipeline"
        EVALUATION = "evaluation"
        CATALOGUE = "catalogue", "dataset catalogue"
        VERIFY = "verify", "extraction verification"
        SERVE_CHECK = "serve_check", "vLLM serve check"
        DEMO_BUILD = "demo_build", "demo target build"
        SHARD = "shard", "stage shard"  # object_id: the StageShard's
        TRAIN_RANK = "train_rank", "training rank"  # object_id: the TrainingNode's (a rank of a multi-node training)

    kind = models.CharField(max_length=20, choices=Kind.choices)
    object_id = models.PositiveIntegerField(help_text="the run's, the evaluation's, the job's or the shard's id")
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

    @property
    def headline(self) -> str:
        """Its error as the pages show it: a sentence, never a traceback (workers.contract.failures)."""
        from workers.contract.failures import failure_headline

        return failure_headline(self.error, stage_name=self.stage)

    @property
    def log_shown(self) -> str:
        from workers.contract.failures import log_shown

        return log_shown(self.log_tail)


class Preparation(StageRecord):
    """Tokenized chats with loss masks, in speculators 0.9's prepared layout."""

    run = models.OneToOneField(PipelineRun, on_delete=models.CASCADE, related_name="preparation")
    dataset = models.ForeignKey("runs.Dataset", on_delete=models.PROTECT, related_name="preparations")
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
    target = models.ForeignKey("runs.TargetModel", on_delete=models.PROTECT, related_name="extract_stages")
    layer_ids = models.JSONField(default=list, help_text="the hidden-state ids the stage captures")
    device = models.CharField(max_length=100, blank=True)
    model_load_seconds = models.FloatField(null=True, blank=True)
    forward_seconds = models.FloatField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    time_split_s = models.JSONField(default=dict, blank=True,
                                    help_text="seconds in model load, forwards, copies to the host and file writes")

    def __str__(self) -> str:
        return f"extract stage of run {self.run_id}"


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
    best_tau = models.FloatField(null=True, blank=True, help_text=(
        "the best checkpoint's τ as our evaluate stage measured it, once the run's rule decided it "
        "(runs.pipeline.best); the lists, sweeps and compare show and sort by it"))
    device = models.CharField(max_length=100, blank=True)
    tokens_per_step = models.PositiveIntegerField(null=True, blank=True, help_text="packing budget actually used")
    loss_tokens_available = models.BigIntegerField(null=True, blank=True, help_text="supervised tokens in the train split")
    loss_tokens_trained = models.BigIntegerField(null=True, blank=True, help_text="of those, reached the loss in the last epoch")
    loss_tokens_per_epoch = models.JSONField(default=list, blank=True)
    rows_unusable = models.PositiveIntegerField(null=True, blank=True, help_text="rows too short to train on")
    split = models.JSONField(default=dict, blank=True, help_text="how rows were split into train and validation")
    resumed_from_step = models.PositiveIntegerField(null=True, blank=True,
                                                    help_text="the step a retried training continued from (0: from scratch)")
    stopped_early = models.TextField(blank=True, help_text=(
        "why training ended before its last epoch (stop_when_tau_flat: τ stopped rising); empty when it did not"))
    step_config = models.CharField(max_length=200, blank=True, help_text="how steps ran: attention, loss, dtype")
    time_split_s = models.JSONField(default=dict, blank=True,
                                    help_text="seconds of the training steps in data wait, copies, forward, backward, optimizer")
    supply = models.JSONField(default=dict, blank=True, help_text=(
        "where the training's hidden states came from and how fast: offline or online, the trainer's "
        "wait for data, the capture servers' tokens/s, the cache's hit rate and peak size, supply- or "
        "compute-bound (workers.stages.train.online.SupplyReport)"))

