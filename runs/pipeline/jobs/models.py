"""Long work a user asks for outside a pipeline run: cataloguing a dataset's conversations and
verifying an extraction's files. Either can take minutes on a large dataset or extraction, so it
runs on a cpu worker, not inside the request, as a stage-like row: status, progress, a lease
renewed by the worker, attempts (runs.pipeline.lifecycle.stages.JOBS registers them beside the stages).

Kept apart from runs/models.py, which imports this so Django finds it."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.pipeline.lifecycle.stage_record import StageRecord
from workers.contract.chats.prompt_source import TAU_WARNING


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
    # The runs whose pages show it: the measured run's, and the run that trained the checkpoint
    # (runs.pipeline.status.changes).
    RUN_LOOKUPS = ("evaluation__run_id", "checkpoint__training_run__run_id")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    tensor_parallel_size = models.PositiveIntegerField(default=1)
    num_prompts = models.PositiveIntegerField(null=True, blank=True)
    # Which prompt list both sides decoded (workers.stages.evaluate.serve_check.prompts_digest), so that
    # "the same prompts" can be checked, not assumed.
    prompts_count = models.PositiveIntegerField(null=True, blank=True)
    prompts_sha256 = models.CharField(max_length=64, blank=True, help_text="sha256 of the prompts' token ids as JSON")
    max_new_tokens = models.PositiveIntegerField(null=True, blank=True)
    num_speculative_tokens = models.PositiveIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=20, blank=True)
    command = models.TextField(blank=True, help_text="the vllm serve line it served the draft with")
    vllm_version = models.CharField(max_length=50, blank=True)
    vllm_build = models.CharField(max_length=20, blank=True)
    tau = models.FloatField(null=True, blank=True, help_text="ours, on the same prompts")
    vllm_tau = models.FloatField(null=True, blank=True, help_text="vLLM's counters: 1 + accepted / drafts")
    vllm_tau_emitted = models.FloatField(null=True, blank=True,
                                         help_text="tokens emitted by vLLM's steps with drafts / those steps: ours")
    tau_difference = models.FloatField(null=True, blank=True, help_text="vllm_tau_emitted minus ours")
    vllm_acceptance_per_position = models.JSONField(default=list, blank=True,
                                                    help_text="vLLM's counters, drafts accepted past a reply's end included")
    vllm_drafts = models.PositiveIntegerField(null=True, blank=True)
    vllm_decode_steps = models.PositiveIntegerField(null=True, blank=True,
                                                    help_text="vLLM's steps after each prompt's first token, drafted or not")
    vllm_replies_cut = models.PositiveIntegerField(null=True, blank=True,
                                                   help_text="replies stopped at max_new_tokens, not at the end token")
    vllm_accepted_tokens = models.PositiveIntegerField(null=True, blank=True)
    vllm_output_matches_greedy = models.BooleanField(null=True, blank=True)
    mismatched_prompts = models.JSONField(default=list, blank=True)
    vllm_tokens_per_s_with = models.FloatField(null=True, blank=True)
    vllm_tokens_per_s_without = models.FloatField(null=True, blank=True)
    vllm_speedup = models.FloatField(null=True, blank=True)
    # The served speed-up at concurrency (issue 39; workers.stages.evaluate.serve_load): the levels asked
    # (the run's serve_concurrency), then one row per level: output tokens/s and time per output token with
    # the draft and without, the speed-up, and the device ("cpu": vLLM's CPU build, "gpu").
    concurrency = models.JSONField(default=list, blank=True, help_text="concurrent requests of each load level")
    concurrency_results = models.JSONField(default=list, blank=True,
                                           help_text="a row per level: tokens/s and ms per token with and without")

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"serve check of checkpoint {self.checkpoint_id}"

    @property
    def disagrees(self) -> bool:
        """vLLM's τ and ours differ by more than the check allows (a warning naming both)."""
        return self.tau_difference is not None and abs(self.tau_difference) > TAU_WARNING


class DatasetRegeneration(StageRecord):
    """A dataset's replies written again by a target (workers.stages.regenerate): every user turn answered
    by the target given the regenerated history before it, so that a draft learns the target's own
    distribution (on-policy data). Asked for on a dataset's page or by `manage.py regenerate_dataset`;
    it makes a new Dataset (`dataset`) whose lineage is this row.

    `settings_key` names what makes the output: the source file as it was (path, size, mtime), the
    target, the backend, the sampling settings, the seed, the sample cap and curation's exclusions.
    Asking again with the same key returns this row, and its file path is derived from it, so a
    retried or re-asked job resumes the file an earlier attempt left."""

    source = models.ForeignKey("runs.Dataset", on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="regenerations", help_text="the dataset whose replies were regenerated")
    source_path = models.CharField(max_length=1000, help_text="kept when the source's row is deleted")
    source_size_bytes = models.BigIntegerField(default=0)
    source_sha256 = models.CharField(max_length=64, blank=True, help_text="the source file's content, read by the worker")
    target = models.ForeignKey("runs.TargetModel", on_delete=models.PROTECT, related_name="regenerations")
    backend = models.CharField(max_length=20, help_text="vllm or transformers")
    backend_version = models.CharField(max_length=50, blank=True)
    tensor_parallel_size = models.PositiveIntegerField(default=1)
    shards = models.PositiveIntegerField(null=True, blank=True, help_text=(
        "workers its conversations are split over at once (issue 36); empty: one per live worker taking its queue, "
        "at most one per 64 conversations"))
    max_new_tokens = models.PositiveIntegerField()
    temperature = models.FloatField(default=0.0)
    seed = models.BigIntegerField(default=0)
    max_samples = models.PositiveIntegerField(null=True, blank=True)
    exclusions = models.JSONField(default=dict, blank=True,
                                  help_text="curation's exclusions when asked: ids, hashes, own_ids")
    settings_key = models.CharField(max_length=64, db_index=True)
    output_path = models.CharField(max_length=1000)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    dataset = models.OneToOneField("runs.Dataset", on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="regeneration", help_text="the dataset it made")
    conversations = models.PositiveIntegerField(null=True, blank=True)
    turns_regenerated = models.PositiveIntegerField(null=True, blank=True)
    replies_cut = models.PositiveIntegerField(null=True, blank=True,
                                              help_text="replies that stopped at max_new_tokens, not at the end")
    failures = models.PositiveIntegerField(null=True, blank=True)
    failure_examples = models.JSONField(default=list, blank=True)
    skipped_excluded = models.PositiveIntegerField(null=True, blank=True)
    resumed_from = models.PositiveIntegerField(null=True, blank=True)
    generated_tokens = models.BigIntegerField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"regeneration {self.pk}"

    @property
    def excluded_count(self) -> int:
        """Samples curation excluded when it was asked (by id, or by content through their own id)."""
        return len((self.exclusions or {}).get("ids", [])) + len((self.exclusions or {}).get("own_ids", []))


class DemoBuild(StageRecord):
    """`make demo`'s target and chats (workers.stages.demo.assets) built on a cpu worker, so the web
    server answers at once and the pages show how far the build is (progress is its training steps
    plus three). A launch naming the demo's paths before it succeeded is refused, saying how far it is
    (runs.data.demo.demo_build_refusal)."""

    out_dir = models.CharField(max_length=1000, blank=True, help_text="where the target and chats are written")
    num_conversations = models.PositiveIntegerField()
    train_steps = models.PositiveIntegerField()
    seed = models.IntegerField(default=0)
    initial_loss = models.FloatField(null=True, blank=True)
    final_loss = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"demo build {self.pk}"
