"""Checkpoints (trained here or imported) and the measurements of their acceptance length.

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

from runs.pipeline.lifecycle.stage_record import StageRecord


class Checkpoint(models.Model):
    """A draft in speculators' format: trained by a run here (`training_run`), or imported
    (`training_run` empty, `imported_at` and `imported_by` set), never both."""

    training_run = models.ForeignKey(
        "runs.TrainingRun", on_delete=models.CASCADE, null=True, blank=True, related_name="checkpoints"
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
        # `epoch` is the trainer's, from 0; people read epochs from 1, as every page counts them.
        return f"epoch {self.epoch + 1} of run {self.training_run.run_id}"

    @property
    def simulated_tau(self) -> float | None:
        """Acceptance length implied by this checkpoint's validation accuracies."""
        from workers.contract.acceptance import cond_accuracies, simulated_tau

        return simulated_tau(cond_accuracies(self.val_metrics))


class Evaluation(StageRecord):
    """Acceptance length of a checkpoint, measured by speculative decoding with its target.

    The pipeline's last stage (`run` set, the run's best checkpoint) or asked for on any registered
    checkpoint (`run` empty)."""

    run = models.OneToOneField("runs.PipelineRun", on_delete=models.CASCADE, null=True, blank=True, related_name="evaluation")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, null=True, blank=True,
                                   related_name="evaluations")
    # The runs whose pages show it: its own run's, and the run that trained the checkpoint
    # (runs.pipeline.status.changes).
    RUN_LOOKUPS = ("run_id", "checkpoint__training_run__run_id")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    prompts_path = models.CharField(max_length=1000, blank=True, help_text="empty: the run's validation conversations")
    # The evaluation suite these prompts are (runs.data.suites): empty for the held-out conversations and for a
    # file asked for by hand.
    suite = models.CharField(max_length=40, blank=True)
    max_prompts = models.PositiveIntegerField(default=32)
    max_new_tokens = models.PositiveIntegerField(default=64)
    num_speculative_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the checkpoint's own")
    prompt_source = models.CharField(max_length=1000, blank=True)
    num_prompts = models.PositiveIntegerField(null=True, blank=True)
    tau = models.FloatField(null=True, blank=True, help_text="tokens per target forward")
    tau_standard_error = models.FloatField(null=True, blank=True, help_text=(
        "τ's standard error over the prompts (workers.contract.acceptance.tau_standard_error); empty: measured "
        "before it was kept, or on one prompt"))
    acceptance_per_position = models.JSONField(default=list, blank=True)
    new_tokens = models.PositiveIntegerField(null=True, blank=True)
    verify_forwards = models.PositiveIntegerField(null=True, blank=True)
    output_matches_greedy = models.BooleanField(null=True, blank=True)
    mismatched_prompts = models.JSONField(default=list, blank=True)
    spec_tokens_per_s = models.FloatField(null=True, blank=True)
    greedy_tokens_per_s = models.FloatField(null=True, blank=True)
    speedup = models.FloatField(null=True, blank=True)
    device = models.CharField(max_length=100, blank=True)
    # τ and acceptance by position for k = 1 up to the draft's k plus EAGLE3WEB_K_BEYOND_TRAINED, and the k
    # with the most tokens per target forward (workers.stages.evaluate.k_table, KTable.as_dict: "k_max",
    # "draft_cost", "recommended_k", "rows" {k: {"tau", "acceptance_per_position", "tokens_per_target_forward"}}).
    k_table = models.JSONField(default=dict, blank=True)
    recommended_k = models.PositiveIntegerField(null=True, blank=True, help_text="empty: measured before the k table")

    class Meta:
        ordering = ["-id"]



class CheckpointGenerations(models.Model):
    """The replies one measurement decoded with a checkpoint, token by token: which draft position
    proposed each token and in which verification forward (workers.stages.evaluate.generations, which
    bounds it and says how). Its own row, not a field of Evaluation, so that the lists of measurements
    never load it."""

    evaluation = models.OneToOneField(Evaluation, on_delete=models.CASCADE, related_name="generations")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="generations")
    num_speculative_tokens = models.PositiveIntegerField()
    tokens_cap = models.PositiveIntegerField(help_text="reply tokens kept per prompt")
    prompts_cap = models.PositiveIntegerField(help_text="prompts kept per measurement")
    prompts = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
