"""The JSON bodies the API accepts. They check the JSON's shape only (types, required fields);
every rule about the values is the form's and the services' (runs.api.bodies.launch), so that a launch
through the API is refused exactly where the page and run_pipeline refuse it."""
from __future__ import annotations

from rest_framework import serializers

from runs.pipeline.launch.run_config import RunConfig

D = RunConfig()


def _int(text: str, *, null: bool = False) -> serializers.IntegerField:
    return serializers.IntegerField(required=False, allow_null=null, help_text=text)


class LaunchSerializer(serializers.Serializer):
    """A run's settings, named as run_pipeline's options (--max-seq-len is max_seq_len). Omitted: the
    default run_pipeline takes."""

    target = serializers.CharField(help_text="target model directory, under EAGLE3WEB_DATA_ROOTS")
    dataset = serializers.CharField(help_text="chat JSONL file (ShareGPT or OpenAI messages), under the data roots")
    name = serializers.CharField(required=False, allow_blank=True, help_text="shown in the runs list")
    project = serializers.CharField(required=False, allow_blank=True,
                                    help_text="the project's name (you must be an editor of it); omitted: your default")
    notes = serializers.CharField(required=False, allow_blank=True, help_text="free text; the runs list searches it")
    layer_ids = serializers.ListField(child=serializers.IntegerField(), required=False,
                                      help_text="hidden-state ids to capture; [] or omitted: EAGLE-3's default")
    max_seq_len = _int(f"tokens per prepared row (default {D.max_seq_len})")
    max_samples = _int("conversations taken from the dataset; null: all", null=True)
    draft_vocab_size = _int(f"default {D.draft_vocab_size}")
    epochs = _int(f"default {D.epochs}")
    lr = serializers.FloatField(required=False, help_text=f"learning rate (default {D.lr})")
    ttt_steps = _int(f"default {D.ttt_steps}")
    max_tokens_per_step = _int("packing budget per training step; null: 512 or the longest row", null=True)
    val_fraction = serializers.FloatField(required=False, help_text=f"held-out share (default {D.val_fraction})")
    seed = _int(f"split and initialisation seed (default {D.seed})")
    eval_prompts = _int(f"held-out conversations decoded to measure acceptance (default {D.eval_prompts})")
    eval_max_new_tokens = _int(f"default {D.eval_max_new_tokens}")
    extraction_backend = serializers.CharField(required=False, help_text=f"default {D.extraction_backend}")
    tensor_parallel_size = _int(f"GPUs for extraction (default {D.tensor_parallel_size})")
    training_backend = serializers.CharField(required=False, help_text=f"default {D.training_backend}")
    train_gpus = _int(f"GPUs for training (default {D.train_gpus})")
    train_nodes = _int(f"worker hosts the training spans, one torchrun rank each (default {D.train_nodes})")
    serve_check = serializers.BooleanField(required=False, help_text="serve the best checkpoint with vLLM after")
    serve_concurrency = serializers.ListField(child=serializers.IntegerField(), required=False, help_text=(
        "the serve check's load: concurrent requests of each level, 1 to 256 (default [1, 8, 32])"))
    live_tau = serializers.BooleanField(required=False, help_text="measure each checkpoint while training runs")
    stop_when_tau_flat = _int("patience in checkpoints: stop training when τ stops rising (implies live_tau)",
                              null=True)
    best_by = serializers.CharField(required=False, help_text=f"{D.best_by} (default: the highest measured τ) or "
                                    "val_loss (the lowest validation loss): which checkpoint is the run's best")
    eval_suites = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, help_text=(
        "evaluation suites measured on every checkpoint besides the held-out prompts: {name: chat JSONL under the "
        "data roots}, \"\" for a registered suite"))
    best_suite = serializers.CharField(required=False, help_text="the suite whose τ chooses the best (default held_out)")
    best_suite_weights = serializers.DictField(child=serializers.FloatField(), required=False, help_text=(
        "or a mix: {suite: weight}, the weights summing to 1"))
    hidden_states = serializers.CharField(required=False, help_text=(
        f"{D.hidden_states} (default: extract, then train) or online (capture servers produce them while training)"))
    capture_urls = serializers.ListField(child=serializers.CharField(), required=False, help_text=(
        "online: base URLs (http://host:port) of running capture servers, at most 16"))
    capture_servers = _int(f"online: capture servers the train stage starts, 0 to 16 (default {D.capture_servers})")
    hidden_states_cache_gib = serializers.FloatField(required=False, help_text=(
        "online: the most the run's hidden-state cache keeps on disk, in GiB: 2**30 bytes "
        f"(default {D.hidden_states_cache_gib:g})"))
    shards = _int("workers a stage that splits (prepare, extraction, evaluation) is shared by at once, 1 to 1024; "
                  "null or omitted: one per live worker taking the stage's queue, at most one per 64 rows", null=True)


class CopySerializer(LaunchSerializer):
    """What to change in the copy; omitted: the copied run's value."""

    target = serializers.CharField(required=False, help_text="default: the copied run's target")
    dataset = serializers.CharField(required=False, help_text="default: the copied run's dataset")


class TagsSerializer(serializers.Serializer):
    tags = serializers.ListField(child=serializers.CharField(allow_blank=True), allow_empty=True,
                                 help_text="the run's tags, replacing those it has; [] removes them all")


class EvaluateSerializer(serializers.Serializer):
    prompts = serializers.CharField(required=False, allow_blank=True,
                                    help_text="a chat JSONL of prompts; omitted: the run's held-out conversations")
    max_new_tokens = serializers.IntegerField(required=False, help_text="default 64")
    max_prompts = serializers.IntegerField(required=False, help_text="default 32")
    num_speculative_tokens = serializers.IntegerField(required=False, allow_null=True,
                                                      help_text="k; omitted: the checkpoint's own")


class ExportSerializer(serializers.Serializer):
    out_dir = serializers.CharField(required=False, allow_blank=True, help_text=(
        "a new folder under the data roots; omitted: one under the runs folder's exports/"))


class ExtractionImportSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="the extraction directory (flat v1, speculators 0.4 or 0.9)")
    target = serializers.CharField(required=False, allow_blank=True,
                                   help_text="target model directory; omitted: the manifest's model_path")


class VerifySerializer(serializers.Serializer):
    full = serializers.BooleanField(required=False, default=False,
                                    help_text="read every value (NaNs, infinities), not only the headers")


class DatasetImportSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="chat JSONL file under the data roots; catalogued by a worker")


class EmptySerializer(serializers.Serializer):
    """No fields; send {} or nothing."""


class RegenerateSerializer(serializers.Serializer):
    target = serializers.IntegerField(help_text="the target's id (GET /api/v1/targets/); its replies replace the file's")
    backend = serializers.CharField(required=False, help_text="auto (default), vllm or transformers")
    max_new_tokens = serializers.IntegerField(required=False, help_text="per reply (default 512)")
    temperature = serializers.FloatField(required=False, help_text="0 (default) is greedy")
    seed = serializers.IntegerField(required=False, help_text="default 0")
    max_samples = serializers.IntegerField(required=False, allow_null=True,
                                           help_text="the first N conversations not excluded; null: all")
    shards = serializers.IntegerField(required=False, allow_null=True, help_text=(
        "workers its conversations are split over at once, 1 to 1024; null or omitted: one per live worker "
        "taking its queue, at most one per 64 conversations"))


class ExternalRunSerializer(serializers.Serializer):
    """A run trained elsewhere (runs.pipeline.launch.external): its client reports its curves, checkpoints and end."""

    external = serializers.BooleanField(help_text="true: the run is trained elsewhere and reported through the API")
    name = serializers.CharField(help_text="shown in the runs list")
    config = serializers.JSONField(help_text="the trainer's settings, any JSON object (epochs, lr, ttt_steps fill "
                                             "the training's columns when given as numbers)")
    target = serializers.CharField(required=False, allow_blank=True,
                                   help_text="target model directory under the data roots, when the trainer names one")
    dataset = serializers.CharField(required=False, allow_blank=True,
                                    help_text="chat JSONL file under the data roots, when the trainer names one")


class PointsSerializer(serializers.Serializer):
    points = serializers.JSONField(help_text=(
        "[{key, split, step, value[, epoch]}, ...], at most 10,000: key a metric name (ASCII letters, digits, "
        "_ . - /; 1 to 50 characters), split train or val, step a whole number from 0 to 2**53, value a finite "
        "number, epoch optional, 0 to 1,000,000 (0 when omitted). A step stored already with the same value is "
        "unchanged, with another value replaced; never doubled"))


class ExternalCheckpointSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="the checkpoint directory (speculators' eagle3 layout) under the data roots")
    epoch = serializers.JSONField(help_text="the epoch it was saved after, a whole number from 0")
    verifier = serializers.CharField(required=False, allow_blank=True,
                                     help_text="a local copy of its target; omitted: the run's target, else the "
                                               "verifier its config.json records")


class RunEndSerializer(serializers.Serializer):
    status = serializers.CharField(help_text="succeeded, failed or cancelled")
    message = serializers.CharField(required=False, allow_blank=True, help_text="why it ended; shown on the run page")
