"""The knobs of one pipeline run, validated the same way for the form, the CLI and the API."""
from __future__ import annotations

import ipaddress
import math
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from workers.contract.backends import BACKENDS_BY_NAME, EXTRACTION_BACKENDS, MAX_GPUS, TRAINING_BACKENDS
from workers.contract.errors import InputError
from workers.contract.host_rule import HostRefused, check_url
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


def check_run_name(name: object) -> str:
    """A run's display name: a string of at most MAX_NAME_CHARS printable characters (stripped)."""
    if not isinstance(name, str):
        raise RunConfigError(f"name must be text, got {type(name).__name__}")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        raise RunConfigError(f"name is {len(name)} characters long; at most {MAX_NAME_CHARS} are allowed")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        raise RunConfigError("name may not hold control characters (newlines, tabs, NUL)")
    return name


def check_layer_ids(layer_ids: object) -> list[int]:
    """A list of at most MAX_LAYER_IDS integers 0..MAX_NUM_LAYERS (the target checks its own range later)."""
    if not isinstance(layer_ids, (list, tuple)):
        raise RunConfigError(f"layer_ids must be a list of integers, got {type(layer_ids).__name__}")
    if len(layer_ids) > MAX_LAYER_IDS:
        raise RunConfigError(f"layer_ids lists {len(layer_ids)} ids; at most {MAX_LAYER_IDS} are allowed")
    for i in layer_ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise RunConfigError(f"layer_ids must be integers, got {str(i)[:40]!r}")
        if not 0 <= i <= MAX_NUM_LAYERS:
            raise RunConfigError(f"layer_ids must lie between 0 and {MAX_NUM_LAYERS}, got {str(i)[:40]}")
    return list(layer_ids)


# How an error names the i-th URL (1-based): the API's and RunConfig's words; the form and run_pipeline
# pass their own ("URL 2", "--capture-url 2").
URL_NAMED = "capture_urls[{}]"


def check_capture_url(url: object, *, index: int, named: str = URL_NAMED) -> str:
    """A capture server's base URL: http(s)://host[:port], with no user, query or fragment, since the
    train stage appends vLLM's own paths to it, whose host the capture host rule allows. Says which URL
    (1-based) is wrong and why."""
    at = named.format(index + 1)
    if not isinstance(url, str):
        raise RunConfigError(f"{at} must be text, got {type(url).__name__}", field="capture_urls")
    url = url.strip()
    shown = url[:100]
    if len(url) > MAX_CAPTURE_URL_CHARS:
        raise RunConfigError(f"{at} is {len(url)} characters long; at most {MAX_CAPTURE_URL_CHARS}",
                             field="capture_urls")
    if any(unicodedata.category(c) in ("Cc", "Cs", "Zs") for c in url):
        raise RunConfigError(f"{at} {shown!r} may not hold spaces or control characters", field="capture_urls")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise RunConfigError(f"{at} {shown!r} must start with http:// or https://", field="capture_urls")
    if not parts.hostname:
        raise RunConfigError(f"{at} {shown!r} names no host (http://host:port)", field="capture_urls")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise RunConfigError(f"{at} {shown!r} must be a server's base URL: no user, query or fragment",
                             field="capture_urls")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise RunConfigError(f"{at} {shown!r} has no valid port (1 to 65535)", field="capture_urls")
    host = parts.hostname
    if not _host_name_ok(host):
        raise RunConfigError(f"{at} {shown!r}: {host[:60]!r} is not a host name or IP address", field="capture_urls")
    _check_capture_host(url, at=at, shown=shown)
    return url.rstrip("/")


def _check_capture_host(url: str, *, at: str, shown: str) -> None:
    """The capture host rule (workers.contract.host_rule, as for webhooks): a worker will send this URL GET and
    POST requests, so its host must be in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS and resolve to public addresses
    unless they are listed too. The worker checks again when it uses the URL."""
    from django.conf import settings

    try:
        check_url(url, allowed=settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS, setting="EAGLE3WEB_CAPTURE_ALLOWED_HOSTS",
                  what="capture server")
    except HostRefused as exc:
        raise RunConfigError(f"{at} {shown!r}: {exc}", field="capture_urls") from None


def _host_name_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(
        0 < len(label) <= 63 and label[0] != "-" and label[-1] != "-"
        and all(c.isascii() and (c.isalnum() or c == "-") for c in label) for label in labels)


def check_capture_urls(urls: object, *, named: str = URL_NAMED) -> list[str]:
    if isinstance(urls, str) or not isinstance(urls, (list, tuple)):
        raise RunConfigError(f"capture_urls must be a list of URLs, got {type(urls).__name__}", field="capture_urls")
    if len(urls) > MAX_CAPTURE_SERVERS:
        raise RunConfigError(f"capture_urls lists {len(urls)} URLs; at most {MAX_CAPTURE_SERVERS} are allowed",
                             field="capture_urls")
    checked = [check_capture_url(url, index=i, named=named) for i, url in enumerate(urls)]
    for i, url in enumerate(checked):
        if url in checked[:i]:
            raise RunConfigError(f"{named.format(i + 1)} {url[:100]!r} is listed twice", field="capture_urls")
    return checked


def parse_capture_urls(text: str, *, named: str = "URL {}") -> list[str]:
    """One URL per line, or separated by commas (the form's box); a URL with a space inside is refused."""
    if len(text) > MAX_CAPTURE_SERVERS * (MAX_CAPTURE_URL_CHARS + 2):
        raise RunConfigError(f"{len(text)} characters is too long for {MAX_CAPTURE_SERVERS} URLs",
                             field="capture_urls")
    return check_capture_urls([part.strip() for part in text.replace(",", "\n").splitlines() if part.strip()],
                              named=named)


@dataclass(frozen=True)
class RunConfig:
    layer_ids: list[int] = field(default_factory=list)  # empty: EAGLE-3 default of the target
    max_seq_len: int = 512
    max_samples: int | None = None
    draft_vocab_size: int = 1024
    epochs: int = 2
    lr: float = 3e-4
    ttt_steps: int = 3
    val_fraction: float = 0.1  # share of rows held out, whole conversations at a time
    seed: int = 0  # the train/validation split and the draft's initialisation
    max_tokens_per_step: int | None = None  # packing budget; raised to the longest row; None: 512 or the longest
    eval_prompts: int = 32  # held-out conversations decoded to measure acceptance
    eval_max_new_tokens: int = 64
    # Where extraction and training run (workers.contract.backends); what a live worker can run is
    # checked at launch (runs.fleet.selectors.launch_refusals).
    extraction_backend: str = "transformers"  # or "vllm"
    training_backend: str = "eagle3web"  # our loop (workers/stages/train/loop.py), or "speculators" under torchrun
    tensor_parallel_size: int = 1  # GPUs for extraction: vLLM's TP size, or transformers' device_map spread
    train_gpus: int = 1  # GPUs for training: torchrun --nproc-per-node for speculators; our loop uses one
    # Worker hosts the training spans: each takes one rank's message and starts torchrun --nnodes train_nodes
    # (workers.stages.train.nodes); refused at launch beyond the live workers that take the training's queue.
    train_nodes: int = 1
    # After measuring acceptance, vLLM itself serves the best checkpoint and counts it (runs.pipeline.jobs.models.ServeCheck).
    serve_check: bool = False
    # The concurrencies the serve check measures vLLM's speed-up at (with the draft and without), each 1..256.
    serve_concurrency: list[int] = field(default_factory=lambda: list(DEFAULT_SERVE_CONCURRENCY))
    best_by: str = BEST_BY[0]  # "tau" or "val_loss" (runs.pipeline.best)
    # τ while training (issue 39): each checkpoint is measured on the evaluate queue as soon as it is saved
    # (runs.pipeline.status.live_tau); with stop_when_tau_flat = P, training stops once the last P measured
    # checkpoints did not beat the best τ before them. P implies live_tau.
    live_tau: bool = False
    stop_when_tau_flat: int | None = None
    # Online: the extract stage writes nothing; training asks capture servers (capture_servers started by the
    # train stage's worker, plus the running ones at capture_urls) and keeps at most hidden_states_cache_gib.
    hidden_states: str = HIDDEN_STATES[0]
    capture_urls: list[str] = field(default_factory=list)
    capture_servers: int = 1
    hidden_states_cache_gib: float = DEFAULT_CACHE_GIB
    # How many workers one stage is split over (issue 36; workers.orchestration.shard_tasks): None decides when the stage
    # starts, one shard per live worker that takes its queue, at most one per 64 rows.
    shards: int | None = None
    # {name: chat file}: measured on every checkpoint besides the held-out prompts (HELD_OUT); a name given
    # with an empty path is a suite registered before (runs.data.suites.eval_suites_register resolves both).
    eval_suites: dict[str, str] = field(default_factory=dict)
    best_suite: str = HELD_OUT  # the suite whose τ chooses the best under best_by "tau"
    best_suite_weights: dict[str, float] = field(default_factory=dict)  # or a mix of suites' τ, summing to 1

    def __post_init__(self) -> None:
        for name, known in (("extraction_backend", EXTRACTION_BACKENDS), ("training_backend", TRAINING_BACKENDS)):
            value = getattr(self, name)
            if value not in known:
                raise RunConfigError(f"{name} must be one of {', '.join(known)}, got {str(value)[:40]!r}", field=name)
        if self.best_by not in BEST_BY:
            raise RunConfigError(f"best_by must be one of {', '.join(BEST_BY)}, got {str(self.best_by)[:40]!r}",
                                 field="best_by")
        if not isinstance(self.live_tau, bool):
            raise RunConfigError(f"live_tau must be true or false, got {str(self.live_tau)[:40]!r}", field="live_tau")
        if not isinstance(self.serve_check, bool):
            raise RunConfigError(f"serve_check must be true or false, got {str(self.serve_check)[:40]!r}",
                                 field="serve_check")
        for name in INT_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RunConfigError(f"{name} must be a whole number, got {str(value)[:40]!r}", field=name)
        for name in FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RunConfigError(f"{name} must be a finite number, got {str(value)[:40]!r}", field=name)
        for name in ("max_seq_len", "draft_vocab_size", "epochs", "lr", "ttt_steps", "val_fraction", "seed",
                     "eval_prompts", "eval_max_new_tokens", "tensor_parallel_size", "train_gpus", "train_nodes", "capture_servers"):
            if getattr(self, name) is None:
                raise RunConfigError(f"{name} is required", field=name)
        object.__setattr__(self, "layer_ids", check_layer_ids(self.layer_ids))
        object.__setattr__(self, "serve_concurrency", check_serve_concurrency(self.serve_concurrency))
        self._check_hidden_states()
        self._check_suites()
        checks = [
            ("max_seq_len", MIN_SEQ_LEN <= self.max_seq_len <= MAX_SEQ_LEN,
             f"max_seq_len must be between {MIN_SEQ_LEN} and {MAX_SEQ_LEN}, got {self.max_seq_len}"),
            ("max_samples", self.max_samples is None or 2 <= self.max_samples <= MAX_SAMPLES,
             f"max_samples must be between 2 and {MAX_SAMPLES}, got {self.max_samples}"),
            ("draft_vocab_size", 2 <= self.draft_vocab_size <= MAX_DRAFT_VOCAB,
             f"draft_vocab_size must be between 2 and {MAX_DRAFT_VOCAB}, got {self.draft_vocab_size}"),
            ("epochs", 1 <= self.epochs <= 1000, f"epochs must be between 1 and 1000, got {self.epochs}"),
            ("lr", 0 < self.lr < 1, f"lr must be between 0 and 1, got {self.lr}"),
            ("ttt_steps", 1 <= self.ttt_steps <= 10, f"ttt_steps must be between 1 and 10, got {self.ttt_steps}"),
            ("val_fraction", 0 < self.val_fraction < 0.5,
             f"val_fraction must be between 0 and 0.5, got {self.val_fraction}"),
            ("seed", 0 <= self.seed < 2**32, f"seed must be between 0 and 2**32 - 1, got {self.seed}"),
            ("max_tokens_per_step", self.max_tokens_per_step is None or 16 <= self.max_tokens_per_step <= 1_048_576,
             f"max_tokens_per_step must be between 16 and 1048576, got {self.max_tokens_per_step}"),
            ("eval_prompts", 1 <= self.eval_prompts <= 1000,
             f"eval_prompts must be between 1 and 1000, got {self.eval_prompts}"),
            ("eval_max_new_tokens", 1 <= self.eval_max_new_tokens <= 4096,
             f"eval_max_new_tokens must be between 1 and 4096, got {self.eval_max_new_tokens}"),
            ("tensor_parallel_size", 1 <= self.tensor_parallel_size <= MAX_GPUS,
             f"tensor_parallel_size must be between 1 and {MAX_GPUS}, got {self.tensor_parallel_size}"),
            ("shards", self.shards is None or 1 <= self.shards <= MAX_SHARDS,
             f"shards must be a whole number from 1 to {MAX_SHARDS} (or left out), got {self.shards}"),
            ("train_gpus", 1 <= self.train_gpus <= MAX_GPUS,
             f"train_gpus must be between 1 and {MAX_GPUS}, got {self.train_gpus}"),
            ("stop_when_tau_flat", self.stop_when_tau_flat is None or 1 <= self.stop_when_tau_flat <= MAX_TAU_PATIENCE,
             f"stop_when_tau_flat (patience, in checkpoints) must be between 1 and {MAX_TAU_PATIENCE}, got "
             f"{self.stop_when_tau_flat}"),
            ("stop_when_tau_flat", self.stop_when_tau_flat is None or self.training_backend == "eagle3web",
             "stop_when_tau_flat needs training_backend eagle3web: speculators' trainer cannot be stopped between "
             "epochs from here"),
            ("train_gpus", self.training_backend != "eagle3web" or self.train_gpus == 1,
             f"train_gpus must be 1 with training_backend eagle3web ({BACKENDS_BY_NAME['eagle3web'].label} "
             f"trains on one device); choose speculators to train on {self.train_gpus} GPUs"),
            ("train_nodes", 1 <= self.train_nodes <= MAX_TRAIN_NODES,
             f"train_nodes must be between 1 and {MAX_TRAIN_NODES}, got {self.train_nodes}"),
            ("train_nodes", self.train_nodes == 1 or self.hidden_states == "offline",
             f"train_nodes must be 1 with online hidden states (each capture server answers one trainer); "
             f"extract the hidden states first (hidden_states offline) to train on {self.train_nodes} nodes"),
            ("train_nodes", self.train_nodes == 1 or self.stop_when_tau_flat is None,
             f"train_nodes must be 1 with stop_when_tau_flat: a stop asked of the writer's node alone would leave "
             f"the other ranks waiting; train on {self.train_nodes} nodes without it"),
        ]
        for name, ok, message in checks:
            if not ok:
                raise RunConfigError(message, field=name)

    def _check_hidden_states(self) -> None:
        if self.hidden_states not in HIDDEN_STATES:
            raise RunConfigError(f"hidden_states must be one of {', '.join(HIDDEN_STATES)}, got "
                                 f"{str(self.hidden_states)[:40]!r}", field="hidden_states")
        object.__setattr__(self, "capture_urls", check_capture_urls(self.capture_urls))
        if not 0 <= self.capture_servers <= MAX_CAPTURE_SERVERS:
            raise RunConfigError(f"capture_servers must be between 0 and {MAX_CAPTURE_SERVERS}, got "
                                 f"{self.capture_servers}", field="capture_servers")
        if not 0 < self.hidden_states_cache_gib <= MAX_CACHE_GIB:
            raise RunConfigError(f"hidden_states_cache_gib must be more than 0 and at most {MAX_CACHE_GIB:,.0f}, got "
                                 f"{self.hidden_states_cache_gib}", field="hidden_states_cache_gib")
        if self.hidden_states == "offline":
            if self.capture_urls:  # said rather than ignored: the user meant something by them
                raise RunConfigError("capture_urls are asked only by an online run: set hidden_states to online, "
                                     "or leave capture_urls empty", field="capture_urls")
            return
        if self.capture_servers == 0 and not self.capture_urls:
            raise RunConfigError("capture_servers 0 starts no capture server: give capture_urls of running ones, or "
                                 "start at least 1", field="capture_servers")

    def _check_suites(self) -> None:
        suites = self.eval_suites
        if not isinstance(suites, dict):
            raise RunConfigError(f"eval_suites must map suite names to chat files, got {type(suites).__name__}",
                                 field="eval_suites")
        if len(suites) > MAX_EVAL_SUITES:
            raise RunConfigError(f"eval_suites lists {len(suites)} suites; at most {MAX_EVAL_SUITES} besides "
                                 f"{HELD_OUT}", field="eval_suites")
        for name, path in suites.items():
            check_suite_name(name)
            if name == HELD_OUT:
                raise RunConfigError(f"{HELD_OUT} is the run's held-out prompts, always measured: give your suite "
                                     "another name", field="eval_suites")
            if not isinstance(path, str) or len(path) > 1000:
                raise RunConfigError(f"eval_suites[{name}] must be a path of at most 1000 characters",
                                     field="eval_suites")
        known = [HELD_OUT, *suites]
        if not isinstance(self.best_suite, str) or self.best_suite not in known:
            raise RunConfigError(f"best_suite {str(self.best_suite)[:40]!r} is not one of the run's suites "
                                 f"({', '.join(known)})", field="best_suite")
        weights = self.best_suite_weights
        if not isinstance(weights, dict):
            raise RunConfigError(f"best_suite_weights must map suite names to weights, got {type(weights).__name__}",
                                 field="best_suite_weights")
        chooses = bool(weights) or self.best_suite != HELD_OUT
        if chooses and self.best_by != "tau":
            raise RunConfigError(f"best_suite and best_suite_weights choose by τ: they need best_by tau, not "
                                 f"{self.best_by}", field="best_suite" if not weights else "best_suite_weights")
        if not weights:
            return
        if self.best_suite != HELD_OUT:
            raise RunConfigError("give best_suite or best_suite_weights, not both", field="best_suite_weights")
        for name, weight in weights.items():
            if name not in known:
                raise RunConfigError(f"best_suite_weights names {str(name)[:40]!r}, not one of the run's suites "
                                     f"({', '.join(known)})", field="best_suite_weights")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                    or weight < 0:
                raise RunConfigError(f"best_suite_weights[{name}] must be a number of at least 0, got "
                                     f"{str(weight)[:40]!r}", field="best_suite_weights")
        total = sum(weights.values())
        if abs(total - 1.0) > WEIGHTS_TOLERANCE:
            raise RunConfigError(f"best_suite_weights must sum to 1, got {total:g} ({', '.join(f'{n}={w:g}' for n, w in weights.items())})",
                                 field="best_suite_weights")

    @property
    def online(self) -> bool:
        return self.hidden_states == "online"

    @property
    def measures_while_training(self) -> bool:
        return self.live_tau or self.stop_when_tau_flat is not None

    def as_dict(self) -> dict:
        return asdict(self)


def check_serve_concurrency(values: object) -> list[int]:
    """The serve check's levels: 1 to MAX_SERVE_LEVELS distinct whole numbers from 1 to 256, in rising order."""
    if not isinstance(values, (list, tuple)):
        raise RunConfigError(f"serve_concurrency must be a list of whole numbers, got {str(values)[:40]!r}",
                             field="serve_concurrency")
    if not 1 <= len(values) <= MAX_SERVE_LEVELS:
        raise RunConfigError(f"serve_concurrency must list 1 to {MAX_SERVE_LEVELS} concurrencies, got {len(values)}",
                             field="serve_concurrency")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RunConfigError(f"serve_concurrency must be whole numbers, got {str(value)[:40]!r}",
                                 field="serve_concurrency")
        if not MIN_SERVE_CONCURRENCY <= value <= MAX_SERVE_CONCURRENCY:
            raise RunConfigError(f"serve_concurrency values must be between {MIN_SERVE_CONCURRENCY} and "
                                 f"{MAX_SERVE_CONCURRENCY} concurrent requests, got {value}", field="serve_concurrency")
    if len(set(values)) != len(values):
        raise RunConfigError(f"serve_concurrency lists a concurrency twice: {', '.join(map(str, values))}",
                             field="serve_concurrency")
    return sorted(values)


def parse_serve_concurrency(text: str) -> list[int]:
    """'1, 8,32' -> [1, 8, 32]; empty text -> the default levels."""
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if not parts:
        return list(DEFAULT_SERVE_CONCURRENCY)
    if len(parts) > MAX_SERVE_LEVELS or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise RunConfigError(f"serve_concurrency must be up to {MAX_SERVE_LEVELS} whole numbers separated by commas, "
                             f"got {text[:60]!r}", field="serve_concurrency")
    return check_serve_concurrency([int(p) for p in parts])


def parse_layer_ids(text: str) -> list[int]:
    """'2, 4,5' -> [2, 4, 5]; empty text -> [] (use the target's default)."""
    if len(text) > MAX_LAYER_IDS_TEXT:
        raise RunConfigError(f"layer ids: {len(text)} characters is too long (at most {MAX_LAYER_IDS_TEXT})")
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if len(parts) > MAX_LAYER_IDS:
        raise RunConfigError(f"layer ids: {len(parts)} given; at most {MAX_LAYER_IDS} are allowed")
    try:
        ids = [int(p) for p in parts if len(p) <= 12]
    except ValueError:
        ids = None
    if ids is None or len(ids) != len(parts):
        raise RunConfigError(f"layer ids must be integers separated by commas, got {text[:100]!r}") from None
    return check_layer_ids(ids)


def check_suite_name(name: object) -> str:
    """A suite's name: 1 to SUITE_NAME_CHARS lowercase letters, digits, '-' or '_', starting with a letter or digit."""
    ok = (isinstance(name, str) and 0 < len(name) <= SUITE_NAME_CHARS and name[0].isascii() and name[0].isalnum()
          and all(c.isascii() and (c.islower() or c.isdigit() or c in "-_") for c in name))
    if not ok:
        raise RunConfigError(f"suite name {str(name)[:60]!r} must be 1 to {SUITE_NAME_CHARS} lowercase letters, digits, "
                             "'-' or '_' (e.g. code, chat, math)", field="eval_suites")
    return name


def parse_pairs(items: list[str], *, field_name: str, named: str) -> dict[str, str]:
    """["code=/data/code.jsonl", "chat"] -> {"code": "/data/code.jsonl", "chat": ""}: NAME=VALUE each (the value may
    be empty only where `field_name` is eval_suites: a suite registered before); a name twice is refused."""
    pairs: dict[str, str] = {}
    for item in items:
        name, _, value = str(item).partition("=")
        name, value = name.strip(), value.strip()
        if field_name != "eval_suites" and not value:
            raise RunConfigError(f"{named} {str(item)[:60]!r} must be NAME=WEIGHT", field=field_name)
        if name in pairs:
            raise RunConfigError(f"{named} names {name[:40]!r} twice", field=field_name)
        pairs[name] = value
    return pairs


def parse_weights(items: list[str], *, named: str = "best_suite_weights") -> dict[str, float]:
    """["held_out=0.5", "code=0.5"] -> {"held_out": 0.5, "code": 0.5}; RunConfig checks names and the sum."""
    weights = {}
    for name, value in parse_pairs(items, field_name="best_suite_weights", named=named).items():
        try:
            weights[name] = float(value)
        except ValueError:
            raise RunConfigError(f"{named} {name}={value[:40]!r}: the weight must be a number",
                                 field="best_suite_weights") from None
    return weights
