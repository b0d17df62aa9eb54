"""Long work a user asks for outside a pipeline run: cataloguing a dataset's conversations and
verifying an extraction's files. Either can take minutes on a large dataset or extraction, so it
runs on a cpu worker, not inside the request, as a stage-like row: status, progress, a lease
renewed by the worker, attempts (runs.pipeline.stages.JOBS registers them beside the stages).

Kept apart from runs/models.py, which imports this so Django finds it."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.pipeline.stage_record import StageRecord


class DatasetCatalogue(StageRecord):
    """One pass over a dataset file that adds the conversations not yet catalogued (for curation)."""

    dataset = models.ForeignKey("runs.Dataset", on_delete=models.CASCADE, related_name="catalogues")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    size_bytes = models.BigIntegerField(default=0, help_text="the file's size when the pass was asked for")
    samples_added = models.PositiveIntegerField(null=True, blank=True)
    samples_total = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"catalogue of {self.dataset_id}"


class VerificationRequest(StageRecord):
    """A user's request to check an extraction's files (headers, or every value when `full`); the
    Verification it produced is linked once done."""

    extraction = models.ForeignKey("runs.Extraction", on_delete=models.CASCADE, related_name="verification_requests")
    full = models.BooleanField(default=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    verification = models.OneToOneField("runs.Verification", on_delete=models.SET_NULL, null=True, blank=True,
                                        related_name="request")

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"verification of {self.extraction_id}"


class ServeCheck(StageRecord):
    """vLLM itself serving a checkpoint with its target, then the target alone, on the prompts an
    evaluation measured our τ on (workers.stages.evaluate.serve_check): vLLM's τ beside ours, whether the
    text stays the target's, and the speed with and without the draft. Asked for on a checkpoint's
    page or by `manage.py serve_check`, and after a run's evaluation when the run asks for it."""

    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.CASCADE, related_name="serve_checks")
    evaluation = models.ForeignKey("runs.Evaluation", on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="serve_checks", help_text="whose prompts and τ it compares with")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    tensor_parallel_size = models.PositiveIntegerField(default=1)
    num_prompts = models.PositiveIntegerField(null=True, blank=True)
    max_new_tokens = models.PositiveIntegerField(null=True, blank=True)
    num_speculative_tokens = models.PositiveIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=20, blank=True)
    command = models.TextField(blank=True, help_text="the vllm serve line it served the draft with")
    vllm_version = models.CharField(max_length=50, blank=True)
    vllm_build = models.CharField(max_length=20, blank=True)
    tau = models.FloatField(null=True, blank=True, help_text="ours, on the same prompts")
    vllm_tau = models.FloatField(null=True, blank=True, help_text="vLLM's counters: 1 + accepted / drafts")
    vllm_tau_emitted = models.FloatField(null=True, blank=True, help_text="tokens vLLM emitted after the first / drafts")
    tau_difference = models.FloatField(null=True, blank=True, help_text="vllm_tau_emitted minus ours")
    vllm_acceptance_per_position = models.JSONField(default=list, blank=True)
    vllm_drafts = models.PositiveIntegerField(null=True, blank=True)
    vllm_accepted_tokens = models.PositiveIntegerField(null=True, blank=True)
    vllm_output_matches_greedy = models.BooleanField(null=True, blank=True)
    mismatched_prompts = models.JSONField(default=list, blank=True)
    vllm_tokens_per_s_with = models.FloatField(null=True, blank=True)
    vllm_tokens_per_s_without = models.FloatField(null=True, blank=True)
    vllm_speedup = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"serve check of checkpoint {self.checkpoint_id}"

    @property
    def disagrees(self) -> bool:
        """vLLM's τ and ours differ by more than the check allows (a warning naming both)."""
        from workers.stages.evaluate.serve_check import TAU_WARNING

        return self.tau_difference is not None and abs(self.tau_difference) > TAU_WARNING
