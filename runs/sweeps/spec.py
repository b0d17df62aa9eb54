"""What a sweep varies, parsed and expanded: `--vary KEY=V1,V2` (the command line) or one such line
per key (the launch form), into the settings of each run. Pure: no database, no files.

Keys are run_pipeline's option names (`--layer-ids` -> `layer_ids`; a hyphen or an underscore, either
way), plus `dataset`. Values are separated by commas; a list value (layer ids) separates its own items
with colons (`layer_ids=2:4:5,1:3:5` is two runs), since its commas already separate values. `default`
stands for an option's empty value: the target's default layers, every conversation, the packing
budget chosen from the data."""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

from runs.pipeline.launch.setting_bounds import MAX_LAYER_IDS, RunConfigError
from runs.pipeline.launch.setting_checks import check_layer_ids

GRID, LIST = "grid", "list"
MODES = (GRID, LIST)
MAX_SWEEP_RUNS = 64  # a sweep's runs are stored and validated in one request: a typo must not make 10,000
MAX_VALUES_TEXT = 10_000  # characters of one key's values
VALUE_SEPARATOR, ITEM_SEPARATOR = ",", ":"
DEFAULT = "default"

INT_KEYS = ("max_seq_len", "max_samples", "draft_vocab_size", "epochs", "ttt_steps", "seed", "max_tokens_per_step",
            "eval_prompts", "eval_max_new_tokens", "tensor_parallel_size", "train_gpus")
FLOAT_KEYS = ("lr", "val_fraction")
TEXT_KEYS = ("extraction_backend", "training_backend")
# Keys whose empty value means "let the run choose": `default` in a sweep.
OPTIONAL_KEYS = ("layer_ids", "max_samples", "max_tokens_per_step")
SWEEP_KEYS = ("layer_ids", *INT_KEYS, *FLOAT_KEYS, *TEXT_KEYS, "dataset")


class SweepError(RunConfigError):
    """A sweep that cannot be launched; its field is the form's `vary` unless a run's own field is to blame.

    str(error) speaks the command line (`--vary lr=abc: ...`); `in_form` says the same in the launch form's
    words (its KEY = V1, V2 lines, "settings"), one message per bad line of the box."""

    def __init__(self, message: str, *, field: str | None = "vary", in_form: list[str] | str | None = None):
        super().__init__(message, field=field)
        self.in_form = [in_form] if isinstance(in_form, str) else list(in_form or [message])


def _refused(cli: str, form: str, core: str) -> SweepError:
    """One error, named as the command line writes it (`cli`) and as the form's box does (`form`)."""
    return SweepError(f"{cli}: {core}", in_form=f"{form}: {core}")


@dataclass(frozen=True)
class Varied:
    """One swept option: its key and its values, each as typed (shown in tables) and as the run takes it."""

    key: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]


# The launch form's labels (runs/web/forms.py; tests/views/sweeps/test_sweep_form_errors.py keeps them in step) and
# its field names where they differ from the key, normalised as normalise_key does, so that a line written
# as the form words a setting ("Learning rate = 1e-4, 3e-4") or names it (dataset_path) sweeps that key.
LABELS = {"layer_ids": "Layer ids", "max_seq_len": "Max seq len", "max_samples": "Max rows",
          "draft_vocab_size": "Draft vocab size", "epochs": "Epochs", "ttt_steps": "TTT steps", "seed": "Seed",
          "max_tokens_per_step": "Tokens per training step", "eval_prompts": "Acceptance prompts",
          "eval_max_new_tokens": "New tokens per prompt", "tensor_parallel_size": "Extraction GPUs",
          "train_gpus": "Training GPUs", "lr": "Learning rate", "val_fraction": "Validation fraction",
          "extraction_backend": "Extraction backend", "training_backend": "Training backend",
          "dataset": "Chat dataset (JSONL)"}
FORM_NAMES = {"dataset_path": "dataset"}


def _normalised(text: str) -> str:
    """'Learning rate' -> learning_rate, '--max-seq-len' -> max_seq_len, 'Chat dataset (JSONL)' ->
    chat_dataset_jsonl."""
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


ALIASES = {**{_normalised(label): key for key, label in LABELS.items()}, **FORM_NAMES}


def accepted_keys() -> str:
    """What a sweep line may name, in words: each key with the form's label beside it."""
    return ", ".join(f'{key} ("{LABELS[key]}")' if _normalised(LABELS[key]) != key else key for key in SWEEP_KEYS)


def normalise_key(raw: str) -> str:
    """The sweep key a line names: run_pipeline's option name (a hyphen or an underscore, any case), the
    launch form's field name or its label."""
    text = _normalised(raw)
    key = text if text in SWEEP_KEYS else ALIASES.get(text)
    if key is None:
        raise SweepError(f"--vary {raw.strip()[:40]!r}: not an option a sweep can vary; vary one of {accepted_keys()}",
                         in_form=f"{raw.strip()[:40]!r} is not a setting; settings you can sweep (by name or "
                                 f"label): {accepted_keys()}")
    return key


def parse_value(key: str, text: str) -> Any:
    """One value as the run takes it; a value that cannot be one names the key and the value."""
    shown, in_form = f"--vary {key}={text[:60]}", f"{key} = {text[:60]}"
    if text.lower() == DEFAULT:
        if key not in OPTIONAL_KEYS:
            raise _refused(shown, in_form, f"only {', '.join(OPTIONAL_KEYS)} have a default to sweep over")
        return [] if key == "layer_ids" else None
    if key == "layer_ids":
        items = [i.strip() for i in text.split(ITEM_SEPARATOR)]
        if len(items) > MAX_LAYER_IDS or not all(i.isascii() and i.isdigit() and len(i) <= 6 for i in items):
            raise SweepError(f"{shown}: layer ids are whole numbers separated by '{ITEM_SEPARATOR}' within one value "
                             f"(commas separate the values), e.g. layer_ids=2:4:5,1:3:5",
                             in_form=f"{in_form}: layer ids are whole numbers separated by '{ITEM_SEPARATOR}' within "
                                     f"one value (commas separate the values), e.g. layer_ids = 2:4:5, 1:3:5")
        try:
            return check_layer_ids([int(i) for i in items])
        except RunConfigError as exc:
            raise _refused(shown, in_form, str(exc)) from None
    if key in INT_KEYS:
        try:
            return int(text.replace("_", ""), 10)
        except ValueError:
            raise _refused(shown, in_form, f"{key} takes whole numbers") from None
    if key in FLOAT_KEYS:
        try:
            value = float(text)
        except ValueError:
            raise _refused(shown, in_form, f"{key} takes numbers, such as 3e-4") from None
        if not math.isfinite(value):
            raise _refused(shown, in_form, f"{key} must be a finite number")
        return value
    return text  # backends and datasets: checked as a single launch checks them


def parse_vary(raw: str) -> Varied:
    """'lr=1e-4,3e-4' -> Varied('lr', ('1e-4', '3e-4'), (0.0001, 0.0003))."""
    key_text, sep, values_text = raw.partition("=")
    if not sep:
        raise SweepError(f"--vary {raw.strip()[:60]!r}: write KEY=V1,V2 (e.g. lr=1e-4,3e-4)",
                         in_form=f"{raw.strip()[:60]!r} has no '=': write one setting per line as KEY = V1, V2 "
                                 "(e.g. lr = 1e-4, 3e-4)")
    key = normalise_key(key_text)
    if len(values_text) > MAX_VALUES_TEXT:
        raise _refused(f"--vary {key}", key, f"{len(values_text):,} characters of values; at most {MAX_VALUES_TEXT:,}")
    texts = tuple(t.strip() for t in values_text.split(VALUE_SEPARATOR))
    if not values_text.strip() or any(not t for t in texts):
        shown = values_text.strip()[:60]
        raise SweepError(f"--vary {key}={shown}: an empty value (write `default` for the option's default, where "
                         "it has one)", in_form=f"{key} = {shown}: an empty value (write `default` for the "
                                                "setting's default, where it has one)")
    values = tuple(parse_value(key, t) for t in texts)
    seen: dict[str, str] = {}
    for text, value in zip(texts, values):
        if (same := seen.get(repr(value))) is not None:
            raise _refused(f"--vary {key}", key, f"{same} and {text} are the same value; each run of a sweep differs")
        seen[repr(value)] = text
    return Varied(key=key, texts=texts, values=values)


def parse_vary_lines(text: str) -> list[Varied]:
    """The launch form's box: one KEY=V1,V2 line per swept key; blank lines are skipped. Every bad line is
    named at once: the SweepError's `in_form` holds a message per bad line (and per key given twice)."""
    varied, problems = [], []
    for line in text.splitlines():
        if line.strip():
            try:
                varied.append(parse_vary(line))
            except SweepError as exc:
                problems.append(exc)
    try:
        check_keys(varied)
    except SweepError as exc:
        problems.append(exc)
    if problems:
        raise SweepError("; ".join(str(p) for p in problems),
                         in_form=[message for p in problems for message in p.in_form])
    return varied


def check_keys(varied: list[Varied]) -> list[Varied]:
    keys = [v.key for v in varied]
    if repeated := sorted({k for k in keys if keys.count(k) > 1}):
        raise SweepError(f"--vary {repeated[0]} is given twice; list all its values in one --vary",
                         in_form=[f"{k} is on {keys.count(k)} lines; put all its values on one line" for k in repeated])
    return varied


def expand(varied: list[Varied], *, mode: str) -> list[dict[str, tuple[str, Any]]]:
    """Each run's swept settings {key: (text, value)}, in order: the product of the values (grid) or
    the i-th value of every key together (list)."""
    if mode not in MODES:
        raise SweepError(f"mode must be {' or '.join(MODES)}, got {str(mode)[:20]!r}", field="mode")
    if not varied:
        raise SweepError("a sweep varies at least one option (--vary KEY=V1,V2)",
                         in_form="a sweep varies at least one setting: write one line KEY = V1, V2")
    columns = [list(zip(v.texts, v.values)) for v in varied]
    if mode == LIST:
        lengths = {v.key: len(v.values) for v in varied}
        if len(set(lengths.values())) > 1:
            counts = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise SweepError(f"--list pairs the i-th values of every key, so each key needs as many values: {counts}",
                             in_form=f"Combine \"List\" takes the i-th value of every line together, so each line "
                                     f"needs as many values: {counts}")
        count = len(varied[0].values)
    else:
        count = math.prod(len(c) for c in columns)
    if count > MAX_SWEEP_RUNS:
        raise SweepError(f"this sweep would launch {count:,} runs; at most {MAX_SWEEP_RUNS} at once "
                         f"(vary fewer values, or use --list)",
                         in_form=f"this sweep would launch {count:,} runs; at most {MAX_SWEEP_RUNS} at once (give fewer "
                                 "values, or Combine \"List\" to take the i-th values of every line together)")
    combos = zip(*columns) if mode == LIST else itertools.product(*columns)
    return [{v.key: pair for v, pair in zip(varied, combo)} for combo in combos]


def settings_text(settings: dict[str, str]) -> str:
    """'lr=1e-4 epochs=2': how a run's swept settings are named (in its name and in errors)."""
    return " ".join(f"{k}={t}" for k, t in settings.items())
