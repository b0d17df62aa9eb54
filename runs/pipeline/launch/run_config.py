"""The knobs of one pipeline run, validated the same way for the form, the CLI and the API. Their bounds are in
runs.pipeline.launch.setting_bounds, the checks of one setting in setting_checks, the capture URLs' in capture_urls."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from runs.pipeline.launch.capture_urls import check_capture_urls
from runs.pipeline.launch.setting_bounds import (BEST_BY, DEFAULT_CACHE_GIB, DEFAULT_SERVE_CONCURRENCY, FLOAT_FIELDS,
                                                 HELD_OUT, HIDDEN_STATES, INT_FIELDS, MAX_CACHE_GIB,
                                                 MAX_CAPTURE_SERVERS, MAX_DRAFT_VOCAB, MAX_EVAL_SUITES, MAX_SAMPLES,
                                                 MAX_SEQ_LEN, MAX_SHARDS, MAX_TAU_PATIENCE, MAX_TRAIN_NODES,
                                                 MIN_SEQ_LEN, WEIGHTS_TOLERANCE, RunConfigError)
from runs.pipeline.launch.setting_checks import check_layer_ids, check_serve_concurrency, check_suite_name
from workers.contract.host.backends import BACKENDS_BY_NAME, EXTRACTION_BACKENDS, MAX_GPUS, TRAINING_BACKENDS


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
    # Where extraction and training run (workers.contract.host.backends); what a live worker can run is
    # checked at launch (runs.fleet.selectors.launch_refusals).
    extraction_backend: str = "transformers"  # or "vllm"
    training_backend: str = "eagle3web"  # our loop (workers/stages/train/loop.py), or "speculators" under torchrun
    tensor_parallel_size: int = 1  # GPUs for extraction: vLLM's TP size, or transformers' device_map spread
    train_gpus: int = 1  # GPUs for training: torchrun --nproc-per-node for speculators; our loop uses one
    # Worker hosts the training spans: each takes one rank's message and starts torchrun --nnodes train_nodes
    # (workers.stages.train.processes.nodes); refused at launch beyond the live workers that take the training's queue.
    train_nodes: int = 1
    # After measuring acceptance, vLLM itself serves the best checkpoint and counts it
    # (runs.pipeline.jobs.models.ServeCheck).
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
    # How many workers one stage is split over (issue 36; workers.orchestration.shard_tasks): None decides when
    # the stage starts, one shard per live worker that takes its queue, at most one per 64 rows.
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
