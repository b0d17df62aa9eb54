"""The bounds a run's settings are held to, shared by the form, the CLI and the API (the form's fields use the
same numbers); the settings renamed since runs stored them; and RunConfigError, which names the setting to blame."""
from __future__ import annotations

from collections.abc import Callable

from workers.contract.errors import InputError
from workers.contract.target import MAX_NUM_LAYERS


# Bounds shared by the form, the CLI and the API (the form's fields use the same numbers).
MAX_NAME_CHARS = 200  # PipelineRun.name's column
MAX_LAYER_IDS = MAX_NUM_LAYERS + 1  # ids 0..N of the largest target a registration accepts
MAX_LAYER_IDS_TEXT = 10_000  # characters of a typed layer-id list
MIN_SEQ_LEN, MAX_SEQ_LEN = 16, 131_072  # tokens per prepared row; long-context targets top out at 128k
MAX_SAMPLES = 2**31 - 1  # conversations taken from a dataset (a 32-bit count)
MAX_DRAFT_VOCAB = 1_000_000  # never more than the target's own vocabulary either
MAX_EPOCHS = 1000
MAX_TTT_STEPS = 10
MIN_TOKENS_PER_STEP, MAX_TOKENS_PER_STEP = 16, 1_048_576
MAX_SEED = 2**32 - 1
MAX_EVAL_PROMPTS = 1000
MAX_EVAL_NEW_TOKENS = 4096
MAX_SHARDS = 1024  # workers one stage is split over (issue 36); a fleet, not a typo
# Which checkpoint is a run's best (runs.pipeline.best): the highest τ measured on its held-out prompts,
# or the lowest validation loss. The first is the default: τ is what a draft is deployed for.
BEST_BY = ("tau", "val_loss")
# Where training reads hidden states (issue 27): "offline", an extraction written whole before training;
# "online", asked of vLLM capture servers while training, through a bounded cache
# (workers.stages.train.online).
HIDDEN_STATES = ("offline", "online")
MAX_TAU_PATIENCE = 100  # checkpoints without a better τ before training stops (stop_when_tau_flat)
MAX_CAPTURE_SERVERS = 16  # started by the train stage, and URLs of running ones, each
MAX_CAPTURE_URL_CHARS = 2000
MAX_CACHE_GIB = 1_000_000.0  # a petabyte: a typo, not a disk
DEFAULT_CACHE_GIB = 20.0
# Settings renamed since runs stored them (migration 0021 renamed the stored ones): an old name given now is
# refused, naming the new one, rather than taken in a unit it never counted in.
RENAMED_SETTINGS = {"hidden_states_cache_gb": ("hidden_states_cache_gib", "it counts GiB (2**30 bytes), not GB")}

# The serve check's load (issue 39, workers.stages.evaluate.serve_load): concurrent requests of each level.
DEFAULT_SERVE_CONCURRENCY = (1, 8, 32)
MIN_SERVE_CONCURRENCY, MAX_SERVE_CONCURRENCY = 1, 256
MAX_SERVE_LEVELS = 8

# Evaluation suites (issue 39, runs.data.suites): named prompt sets every checkpoint is measured on besides
# the held-out prompts, which are always among them under HELD_OUT; the best is chosen by one of them
# (best_suite) or by a weighted mix (best_suite_weights, summing to 1 within WEIGHTS_TOLERANCE).
HELD_OUT = "held_out"
MAX_EVAL_SUITES = 8
SUITE_NAME_CHARS = 40
WEIGHTS_TOLERANCE = 1e-3

INT_FIELDS = ("max_seq_len", "max_samples", "draft_vocab_size", "epochs", "ttt_steps", "seed",
              "max_tokens_per_step", "eval_prompts", "eval_max_new_tokens", "tensor_parallel_size", "train_gpus",
              "train_nodes", "capture_servers", "stop_when_tau_flat", "shards")
MAX_TRAIN_NODES = 64  # worker hosts one training spans (torchrun --nnodes)
FLOAT_FIELDS = ("lr", "val_fraction", "hidden_states_cache_gib")


def renamed_setting(name: str, *, named: Callable[[str], str] = str) -> str | None:
    """What to say of a setting given by its old name (`named` words a name: a flag on the command line), or None."""
    if name not in RENAMED_SETTINGS:
        return None
    new, why = RENAMED_SETTINGS[name]
    return f"{named(name)} was renamed {named(new)}: {why}; give {named(new)}"


class RunConfigError(InputError):
    """A setting that cannot be used; `field` names it when one field is to blame (the form marks it)."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field

