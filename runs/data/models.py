"""Datasets, targets and extractions: what runs are made from (and what users bring).

runs/models.py imports these so Django finds them."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse


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


class EvalSuite(models.Model):
    """A named prompt set (code, chat, math, a team's own traffic): a chat file under the data roots that runs
    measure every checkpoint on besides their held-out prompts (runs.data.suites). Registered by the first run
    that names it with a path; curated in the admin (its notes, whether launches may still name it)."""

    name = models.CharField(max_length=40, unique=True)
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    notes = models.TextField(blank=True)
    retired = models.BooleanField(default=False, help_text="refused to new runs; measurements already made stay")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DatasetSample(models.Model):
    """One conversation of a dataset, for curation: excluded ones are skipped by later preparations."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="samples")
    sample_id = models.CharField(max_length=200, help_text="the row's id, or its 0-based line index")
    line = models.PositiveIntegerField()
    num_turns = models.PositiveIntegerField()
    num_chars = models.PositiveIntegerField(db_index=True)
    preview = models.TextField(blank=True)
    excluded = models.BooleanField(default=False)  # indexed with the dataset, where true (sample_excluded)
    tags = models.CharField(max_length=500, blank=True, help_text="comma-separated")
    notes = models.TextField(blank=True)
    # sha256 of the conversation (workers.contract.chats.jsonl.content_hash): curation follows it when a row
    # without an "id" moves to another line. "" until a catalogue pass after migration 0018 fills it.
    content_hash = models.CharField(max_length=64, blank=True, db_index=True)

    class Meta:
        # By the dataset's id, not its name: a sort that the index below serves from its first entries, where
        # sorting by name read every sample (migration 0038).
        ordering = ["dataset_id", "line", "id"]
        constraints = [models.UniqueConstraint(fields=["dataset", "sample_id"], name="unique_sample_id")]
        indexes = [models.Index(fields=["dataset", "line", "id"], name="sample_dataset_line"),
                   # A dataset's excluded samples (its page's count, a preparation's skips) from the index alone.
                   models.Index(fields=["dataset"], condition=models.Q(excluded=True), name="sample_excluded")]

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
    produced_by = models.OneToOneField("runs.ExtractStage", on_delete=models.CASCADE, null=True, blank=True,
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
    def run(self) -> models.Model | None:
        """The run (a PipelineRun) whose extract stage wrote it; None when imported."""
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
        from workers.contract.extraction.dtypes import floor_bytes_per_token

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

