from __future__ import annotations

import unicodedata

from django import forms

from runs.fleet.fit import BackendOption
from runs.data.paths import MAX_PATH_CHARS
from runs.pipeline.launch.capture_urls import parse_capture_urls
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import (BEST_BY, DEFAULT_CACHE_GIB, HIDDEN_STATES, MAX_CACHE_GIB,
                                                 MAX_CAPTURE_SERVERS, MAX_DRAFT_VOCAB, MAX_EPOCHS, MAX_EVAL_NEW_TOKENS,
                                                 MAX_EVAL_PROMPTS, MAX_NAME_CHARS, MAX_SAMPLES, MAX_SEED, MAX_SEQ_LEN,
                                                 MAX_SHARDS, MAX_TOKENS_PER_STEP, MAX_TRAIN_NODES, MAX_TTT_STEPS,
                                                 MIN_SEQ_LEN, MIN_TOKENS_PER_STEP, SUITE_NAME_CHARS, RunConfigError)
from runs.pipeline.launch.setting_checks import (check_run_name, parse_layer_ids, parse_pairs, parse_serve_concurrency,
                                                 parse_weights)
from runs.sweeps.services import MAX_PARALLEL
from runs.sweeps.spec import ITEM_SEPARATOR, MODES, SweepError, Varied, parse_vary_lines
from runs.data.regeneration import MAX_NEW_TOKENS_LIMIT, MAX_SEED as MAX_REGENERATE_SEED, MAX_TEMPERATURE, RegenerationSettings
from runs.data.models import TargetModel
from workers.contract.host.backends import BACKENDS, MAX_GPUS


class BackendSelect(forms.Select):
    """A select whose backends no live worker can run are shown, disabled, with the reason."""

    def __init__(self, *args, disabled: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.disabled = disabled or {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        if value in self.disabled:
            # A selected option stays enabled (a copied run's backend, say): a browser leaves a disabled
            # one out of the form, which would then launch the default backend without a word.
            # Submitted, it is refused at its field with the same reason.
            option["attrs"]["disabled"] = not selected
            option["label"] = f"{label} (not available: {self.disabled[value]})"
        return option


def _backend_choices(stage: str) -> list[tuple[str, str]]:
    return [(b.name, b.label) for b in BACKENDS if b.stage == stage]


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=MAX_NAME_CHARS, required=False, help_text="Optional; shown in the runs list.")
    project = forms.CharField(max_length=100, required=False, help_text=(
        "The project the run goes into: those you may launch in (an editor or owner there). Preselected: "
        "Default, the project a launch naming none goes into, until you choose another."))
    notes = forms.CharField(max_length=10_000, required=False, widget=forms.Textarea(attrs={"rows": 2}),
                            help_text="Optional; the runs list's search finds runs by the words in their notes.")
    target_path = forms.CharField(
        max_length=MAX_PATH_CHARS, label="Target model directory",
        help_text="A Hugging Face model directory (config.json, weights, tokenizer) under the data roots.",
    )
    dataset_path = forms.CharField(
        max_length=MAX_PATH_CHARS, label="Chat dataset (JSONL)",
        help_text="ShareGPT `conversations` or OpenAI-style `messages`, one conversation per line.",
    )
    layer_ids = forms.CharField(
        max_length=200, required=False, label="Layer ids",
        help_text="Hidden-state indices to capture (0 = embeddings). The final hidden state N is "
        "always added last. Empty: EAGLE-3's default [2, N//2, N-3] + N.",
    )
    max_seq_len = forms.IntegerField(min_value=MIN_SEQ_LEN, max_value=MAX_SEQ_LEN, initial=512)
    # A run counts rows as speculators counts samples: one per assistant reply that trains (a conversation
    # fans out into a row per reply), read from the start of the file (workers.stages.prepare.stage).
    max_samples = forms.IntegerField(
        min_value=2, max_value=MAX_SAMPLES, required=False, label="Max rows",
        help_text="Training rows read from the start of the dataset, one per assistant reply (a conversation "
                  "with three replies gives three rows), as speculators counts samples. Empty: every row.")
    draft_vocab_size = forms.IntegerField(min_value=2, max_value=MAX_DRAFT_VOCAB, initial=1024)
    epochs = forms.IntegerField(min_value=1, max_value=MAX_EPOCHS, initial=2)
    lr = forms.FloatField(min_value=1e-7, max_value=0.5, initial=3e-4, label="Learning rate")
    ttt_steps = forms.IntegerField(min_value=1, max_value=MAX_TTT_STEPS, initial=3, label="TTT steps")
    shards = forms.IntegerField(
        min_value=1, max_value=MAX_SHARDS, required=False, label="Shards per stage",
        help_text="Workers a stage that splits (prepare, the extraction, the evaluation) is shared by at once; its "
                  "outputs are what one worker makes. Empty: one per live worker that takes the stage's queue, at "
                  "most one per 64 rows.")
    max_tokens_per_step = forms.IntegerField(
        min_value=MIN_TOKENS_PER_STEP, max_value=MAX_TOKENS_PER_STEP, required=False, label="Tokens per training step",
        help_text="Rows are packed up to this many tokens per step. Never shorter than the longest "
        "prepared row (raised to it, so no row is cut). Empty: 512 or the longest row.")
    val_fraction = forms.FloatField(
        min_value=0.01, max_value=0.49, initial=0.1, required=False, label="Validation fraction",
        help_text="Share of rows held out, whole conversations at a time.")
    seed = forms.IntegerField(min_value=0, max_value=MAX_SEED, initial=0, required=False,
                              help_text="Fixes the train/validation split and the draft's initialisation.")
    eval_prompts = forms.IntegerField(
        min_value=1, max_value=MAX_EVAL_PROMPTS, initial=32, required=False, label="Acceptance prompts",
        help_text="Held-out conversations decoded with the draft to measure acceptance length.")
    eval_max_new_tokens = forms.IntegerField(min_value=1, max_value=MAX_EVAL_NEW_TOKENS, initial=64, required=False,
                                             label="New tokens per prompt")
    extraction_backend = forms.ChoiceField(choices=_backend_choices("extract"), initial="transformers", required=False,
                                           label="Extraction backend", widget=BackendSelect)
    tensor_parallel_size = forms.IntegerField(
        min_value=1, max_value=MAX_GPUS, initial=1, required=False, label="Extraction GPUs",
        help_text="vLLM's tensor-parallel size, or how many GPUs Transformers spreads the target over. "
        "Transformers and eagle3web's loop run on the CPU on a worker without a GPU.")
    training_backend = forms.ChoiceField(choices=_backend_choices("train"), initial="eagle3web", required=False,
                                         label="Training backend", widget=BackendSelect)
    train_gpus = forms.IntegerField(min_value=1, max_value=MAX_GPUS, initial=1, required=False, label="Training GPUs",
                                    help_text="torchrun processes for speculators' trainer; eagle3web's loop uses one.")
    train_nodes = forms.IntegerField(
        min_value=1, max_value=MAX_TRAIN_NODES, initial=1, required=False, label="Training nodes",
        help_text="Worker hosts the training spans (torchrun --nnodes): each live worker taking the training's queue "
        "holds one rank; the global batch is split over them.")
    serve_check = forms.BooleanField(
        required=False, label="Check with vLLM",
        help_text="After measuring acceptance, vLLM itself serves the best checkpoint on the same prompts and counts "
        "what it accepts (needs a live worker with vLLM).")
    serve_concurrency = forms.CharField(
        required=False, max_length=200, initial="1, 8, 32", label="Serve check concurrencies",
        help_text="Concurrent requests the serve check loads vLLM with, with the draft and without, 1 to 256 each, "
        "separated by commas: output tokens/s, time per output token and the speed-up at each.")
    live_tau = forms.BooleanField(
        required=False, label="Measure τ while training",
        help_text="Each checkpoint is measured on the evaluate queue (another worker) as soon as it is saved, so the "
        "τ curve grows while training runs.")
    stop_when_tau_flat = forms.IntegerField(
        min_value=1, max_value=100, required=False, label="Stop when τ is flat (patience)",
        help_text="Stop training once this many measured checkpoints in a row did not beat the best τ before them "
        "(measures τ while training). Empty: train every epoch.")
    best_by = forms.ChoiceField(
        choices=list(zip(BEST_BY, ("highest measured τ", "lowest validation loss"), strict=True)), initial=BEST_BY[0],
        required=False, label="Best checkpoint by",
        help_text="Highest τ: the checkpoint that decodes the held-out prompts fastest (vLLM's τ where the serve "
        "check ran), the lower validation loss on a tie; chosen once every checkpoint is measured, until then "
        "the lowest validation loss stands in. Lowest validation loss: the trainer's choice.")
    eval_suites = forms.CharField(
        required=False, max_length=20_000, label="Evaluation suites",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text="Prompt sets every checkpoint is measured on besides the held-out prompts (held_out), one per "
        "line: NAME=PATH to a chat JSONL under the data roots (registered under NAME), or NAME alone for a "
        "registered one: code=/data/code.jsonl")
    best_suite = forms.CharField(
        required=False, max_length=SUITE_NAME_CHARS, label="Best by τ on suite",
        help_text="The suite whose τ chooses the best checkpoint (empty: held_out).")
    best_suite_weights = forms.CharField(
        required=False, max_length=2000, label="Or by a mix of suites",
        help_text="NAME=WEIGHT separated by commas, summing to 1: held_out=0.5, code=0.5 (instead of one suite).")
    hidden_states = forms.ChoiceField(
        choices=list(zip(HIDDEN_STATES, ("offline: extract them all to disk, then train",
                                         "online: capture servers produce them while training"), strict=True)),
        initial=HIDDEN_STATES[0], required=False, label="Hidden states",
        help_text="Online writes no extraction: the training asks vLLM capture servers for each sample when it first "
        "needs it and keeps at most the cache below on disk (speculators' trainer asks the first server through its "
        "own --vllm-endpoint). The train stage goes to a worker with vLLM when it starts capture servers.")
    capture_servers = forms.IntegerField(
        min_value=0, max_value=MAX_CAPTURE_SERVERS, initial=1, required=False, label="Capture servers to start",
        help_text="vLLM capture servers the train stage starts beside the trainer (online only); 0 with running ones "
        "below.")
    capture_urls = forms.CharField(
        required=False, max_length=MAX_CAPTURE_SERVERS * 2002, label="Running capture servers",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text=f"Online only: base URLs (http://host:port) of capture servers already running, one per line, at "
        f"most {MAX_CAPTURE_SERVERS}; their hidden-state files must be readable by the training's worker.")
    hidden_states_cache_gib = forms.FloatField(
        min_value=0.001, max_value=MAX_CACHE_GIB, initial=DEFAULT_CACHE_GIB, required=False,
        label="Hidden-state cache (GiB)",
        help_text="Online only: the most the run keeps on disk, in GiB (2**30 bytes); the least recently used "
        "samples go first and are asked for again when needed.")
    vary = forms.CharField(
        required=False, max_length=20_000, label="Sweep", widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="One setting per line, KEY = V1, V2, named as run_pipeline names them or by its label above: "
        "lr = 1e-4, 3e-4 (or Learning rate = 1e-4, 3e-4) · "
        f"epochs = 1, 2 · layer_ids = 2{ITEM_SEPARATOR}4{ITEM_SEPARATOR}5, 1{ITEM_SEPARATOR}3{ITEM_SEPARATOR}5 "
        f"(ids within one value by '{ITEM_SEPARATOR}') · ttt_steps, draft_vocab_size, max_samples, dataset, ... "
        "`default` for an empty setting. Each run takes the settings above with its own values. Empty: one run.")
    sweep_mode = forms.ChoiceField(choices=[("grid", "Grid: every combination"),
                                            ("list", "List: the i-th values of every line together")],
                                   initial="grid", required=False, label="Combine")
    parallel = forms.IntegerField(
        min_value=1, max_value=MAX_PARALLEL, initial=1, required=False, label="Runs of the sweep at once",
        help_text="The others wait until one finishes, so that a sweep never queues ahead of other people's runs.")

    # Folded under "Advanced settings" (open when one of them has an error), and the sweep box.
    ADVANCED = ("max_tokens_per_step", "val_fraction", "seed", "eval_prompts", "eval_max_new_tokens",
                "extraction_backend", "tensor_parallel_size", "training_backend", "train_gpus", "train_nodes", "serve_check",
                "serve_concurrency", "best_by", "live_tau", "stop_when_tau_flat", "eval_suites", "best_suite", "best_suite_weights",
                "hidden_states", "capture_servers", "capture_urls", "hidden_states_cache_gib", "shards")
    SWEEP = ("vary", "sweep_mode", "parallel")
    WIDE = ("name", "target_path", "dataset_path", "notes", "vary")  # the whole width of the form

    def __init__(self, *args, options: dict[str, BackendOption] | None = None, projects: list[str] | None = None,
                 default_project: str = "", **kwargs):
        """`options`: what the live workers can run (runs.fleet.selectors.launch_options); the
        backends and GPU counts they cannot are shown disabled or capped, with the reason. `projects`: the
        names of those the user may launch into, offered in a select that shows `default_project` selected
        unless another was given (a copied run's): the form never leaves the project to be guessed."""
        super().__init__(*args, **kwargs)
        if projects is not None:
            chosen = self.initial.get("project") or default_project
            names = list(projects) + [n for n in (chosen,) if n and n not in projects]
            self.fields["project"].widget = forms.Select(choices=[(n, n) for n in names])
            self.initial["project"] = chosen
        if options is None:
            return
        for backend_field, gpus_field, stage in (("extraction_backend", "tensor_parallel_size", "extract"),
                                                 ("training_backend", "train_gpus", "train")):
            offered = [o for o in options.values() if o.stage == stage]
            self.fields[backend_field].widget.disabled = {o.name: o.reason for o in offered if not o.available}
            limits = [f"{o.label} {o.counts_text}" if o.available else f"{o.label}: {o.reason}" for o in offered]
            self.fields[gpus_field].help_text += " Live workers: " + "; ".join(limits) + "."
            # An offered backend runs on one GPU at least (runs.fleet.selectors.launch_options).
            self.fields[gpus_field].widget.attrs["max"] = max((o.max_gpus for o in offered if o.available), default=1)

    def basic_fields(self) -> list:
        return [f for f in self if f.name not in self.ADVANCED and f.name not in self.SWEEP]

    def advanced_fields(self) -> list:
        return [self[name] for name in self.ADVANCED]

    def sweep_fields(self) -> list:
        return [self[name] for name in self.SWEEP]

    def advanced_has_errors(self) -> bool:
        return any(self.errors.get(name) for name in self.ADVANCED)

    def sweep_open(self) -> bool:
        return bool(self.data.get("vary", "").strip()) or any(self.errors.get(name) for name in self.SWEEP)

    def error_summary(self) -> list[tuple[str, str, str]]:
        """Every error of the form for the summary at its top, (field id or "", label, message), in the
        form's order: each field's error is also under its field, where the summary links to."""
        summary = [("", "", str(e)) for e in self.non_field_errors()]
        for field in self:
            summary.extend((field.id_for_label, str(field.label), str(e)) for e in field.errors)
        return summary

    def clean_vary(self) -> list[Varied]:
        try:
            return parse_vary_lines(self.cleaned_data.get("vary") or "")
        except SweepError as exc:  # every bad line, in the form's words (str(exc) is the command line's)
            raise forms.ValidationError(exc.in_form) from None

    def clean_sweep_mode(self) -> str:
        return self.cleaned_data.get("sweep_mode") or MODES[0]

    def clean_parallel(self) -> int:
        return self.cleaned_data.get("parallel") or 1

    def clean_name(self) -> str:
        try:
            return check_run_name(self.cleaned_data.get("name") or "")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict:
        cleaned = super().clean()
        for name in ("target_path", "dataset_path"):
            value = cleaned.get(name)
            if isinstance(value, str) and any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
                self.add_error(name, "a path may not hold control characters (NUL, newlines, tabs)")
        return cleaned

    def clean_layer_ids(self) -> list[int]:
        try:
            return parse_layer_ids(self.cleaned_data.get("layer_ids") or "")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_serve_concurrency(self) -> list[int]:
        try:
            return parse_serve_concurrency(self.cleaned_data.get("serve_concurrency") or "")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_capture_urls(self) -> list[str]:
        try:
            return parse_capture_urls(self.cleaned_data.get("capture_urls") or "")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_eval_suites(self) -> dict[str, str]:
        lines = [line.strip() for line in (self.cleaned_data.get("eval_suites") or "").splitlines() if line.strip()]
        try:
            return parse_pairs(lines, field_name="eval_suites", named="suite")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_best_suite_weights(self) -> dict[str, float]:
        text = self.cleaned_data.get("best_suite_weights") or ""
        try:
            return parse_weights([part.strip() for part in text.split(",") if part.strip()], named="weight")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def run_config(self) -> RunConfig:
        """The form's values; a field left empty takes RunConfig's default."""
        data = {k: v for k, v in self.cleaned_data.items() if v is not None and k not in self.SWEEP}
        defaults = RunConfig()
        for name in ("val_fraction", "seed", "eval_prompts", "eval_max_new_tokens"):
            data.setdefault(name, getattr(defaults, name))
        return RunConfig(
            layer_ids=data["layer_ids"],
            max_seq_len=data["max_seq_len"],
            max_samples=data.get("max_samples"),
            draft_vocab_size=data["draft_vocab_size"],
            epochs=data["epochs"],
            lr=data["lr"],
            ttt_steps=data["ttt_steps"],
            max_tokens_per_step=data.get("max_tokens_per_step"),
            val_fraction=data["val_fraction"],
            seed=data["seed"],
            eval_prompts=data["eval_prompts"],
            eval_max_new_tokens=data["eval_max_new_tokens"],
            extraction_backend=data.get("extraction_backend") or defaults.extraction_backend,
            tensor_parallel_size=data.get("tensor_parallel_size") or defaults.tensor_parallel_size,
            training_backend=data.get("training_backend") or defaults.training_backend,
            train_gpus=data.get("train_gpus") or defaults.train_gpus,
            train_nodes=data.get("train_nodes") or defaults.train_nodes,
            serve_check=bool(data.get("serve_check")),
            serve_concurrency=data.get("serve_concurrency") or list(defaults.serve_concurrency),
            best_by=data.get("best_by") or defaults.best_by,
            live_tau=bool(data.get("live_tau")),
            stop_when_tau_flat=data.get("stop_when_tau_flat"),
            hidden_states=data.get("hidden_states") or defaults.hidden_states,
            capture_urls=data.get("capture_urls") or [],
            capture_servers=defaults.capture_servers if data.get("capture_servers") is None else data["capture_servers"],
            hidden_states_cache_gib=data.get("hidden_states_cache_gib") or defaults.hidden_states_cache_gib,
            shards=data.get("shards"),
            eval_suites=data.get("eval_suites") or {},
            best_suite=(data.get("best_suite") or "").strip() or defaults.best_suite,
            best_suite_weights=data.get("best_suite_weights") or {},
        )


class RegenerateForm(forms.Form):
    target = forms.ModelChoiceField(queryset=TargetModel.objects.all(), empty_label=None,
                                    help_text="Its replies replace the file's; its tokenizer's chat template formats "
                                              "each conversation.")
    backend = forms.ChoiceField(choices=[("auto", "auto: vLLM where a worker runs it, else transformers"),
                                         ("vllm", "vLLM (vllm serve, its chat endpoint)"),
                                         ("transformers", "transformers (generate)")], initial="auto")
    max_new_tokens = forms.IntegerField(min_value=1, max_value=MAX_NEW_TOKENS_LIMIT, initial=512,
                                        help_text="Per reply. A reply cut here is counted and shown: it would teach "
                                                  "the draft to stop nowhere.")
    temperature = forms.FloatField(min_value=0.0, max_value=MAX_TEMPERATURE, initial=0.0,
                                   help_text="0 is greedy: the replies the target itself would give.")
    seed = forms.IntegerField(min_value=0, max_value=MAX_REGENERATE_SEED, initial=0)
    max_samples = forms.IntegerField(min_value=1, required=False, label="Max conversations",
                                     help_text="The first N conversations not excluded by curation (whole "
                                               "conversations: every reply of each); empty for all.")
    shards = forms.IntegerField(min_value=1, max_value=MAX_SHARDS, required=False, label="Shards",
                                help_text="Workers that share its conversations at once; empty: one per live worker "
                                          "taking its queue, at most one per 64 conversations.")

    def regeneration_settings(self) -> RegenerationSettings:
        data = self.cleaned_data
        return RegenerationSettings(backend=data["backend"], max_new_tokens=data["max_new_tokens"],
                                    temperature=float(data["temperature"]), seed=data["seed"],
                                    max_samples=data["max_samples"], shards=data["shards"])
