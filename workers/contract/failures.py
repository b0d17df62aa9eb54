"""A stage's failure in a user's words: what stopped, what to change, and whether a retry can help.

`failure_explain` turns the exception a stage raised into a `Failure`: one sentence for the page's
headline, the kind of remedy, the launch form's field to change (if one is at fault) and why a
retry is or is not offered. The rules are a table, tried in order; the first that matches wins, and
a generic sentence catches the rest. The traceback never goes into the sentence: `trace_for_developers`
writes the frames for the stage's "details for developers", without Python's banner.

Torch-free and Django-free: exceptions are matched by their class names (a CUDA out-of-memory error
or a database's OperationalError is known without importing torch or Django), so the web tier and
the stages' tests read the same table. Stored failures (a lost worker's lease, a refusal recorded
without an exception) go through `failure_from_text`.
"""
from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from typing import Callable

# Remedy kinds: what the page offers.
TRANSIENT = "transient"  # the same run can succeed again: Retry
SETTINGS = "settings"    # the run's settings are at fault: Copy with changes, naming the field
INPUTS = "inputs"        # the target or dataset is at fault: Copy with changes (another path, or fix the file)
UNKNOWN = "unknown"      # not recognised: Retry is offered (it may pass), and so is a copy
KINDS = (TRANSIENT, SETTINGS, INPUTS, UNKNOWN)
RETRYABLE_KINDS = (TRANSIENT, UNKNOWN)

STAGE_WORDS = {  # how a sentence names a stage or job
    "prepare": "preparation", "extract": "extraction", "vocab": "vocabulary mapping", "train": "training",
    "evaluate": "evaluation", "catalogue": "catalogue", "verify": "verification", "serve_check": "serve check",
    "regenerate": "regeneration", "demo_build": "demo target build", "online_keep": "cache keeping",
}

WHY = {
    TRANSIENT: "the cause was passing (a lost worker, a busy GPU, a server or database away): a retry can succeed",
    SETTINGS: "the run's settings caused it: a retry with the same settings fails the same way; launch a copy "
              "with the change",
    INPUTS: "the run's target or dataset caused it: a retry with the same files fails the same way; launch a copy "
            "with other files, or fix them first",
    UNKNOWN: "the cause is not recognised: a retry may succeed if it was passing",
}


@dataclass(frozen=True)
class Failure:
    sentence: str
    kind: str
    field: str = ""  # the launch form's field to change, where one is at fault
    specific: bool = False  # a rule of the table worded it (not the generic sentence of an input error or the fallback)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    @property
    def why(self) -> str:
        return WHY[self.kind]


def _first_line(text: str, limit: int = 300) -> str:
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _sentence(text: str) -> str:
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


@dataclass(frozen=True)
class Rule:
    """Matches an exception whose class (or a base) is one of `types` (any type when empty) and whose
    message matches `pattern`, in one of `stages` (any when empty); `write` words the sentence from
    the match, the stage's name and the context (target, dataset paths)."""
    types: tuple[str, ...]
    pattern: str
    kind: str
    field: str
    write: Callable[[re.Match, str, dict], str]
    stages: tuple[str, ...] = ()

    def match(self, names: set[str], message: str, stage_name: str) -> re.Match | None:
        if self.types and not names & set(self.types):
            return None
        if self.stages and stage_name not in self.stages:
            return None
        return re.search(self.pattern, message, re.IGNORECASE | re.DOTALL)


def _stage(stage_name: str) -> str:
    return STAGE_WORDS.get(stage_name, stage_name.replace("_", " "))


def _oom(match: re.Match, stage_name: str, context: dict) -> str:
    budget = context.get("max_tokens_per_step")
    at = f" at a batch of {budget:,} tokens" if isinstance(budget, int) else ""
    change = ("lower max_tokens_per_step, or retry when the GPU is less busy" if stage_name == "train" else
              "retry when the GPU is less busy, or use a GPU with more memory")
    return f"The GPU ran out of memory during {_stage(stage_name)}{at}: {change}."


def _tokenizer(match: re.Match, stage_name: str, context: dict) -> str:
    where = context.get("target") or "the target's directory"
    return (f"The target's tokenizer could not be loaded from {where}: tokenizer.json is missing or unreadable. "
            "Pick another target or add the file.")


def _no_rows(match: re.Match, stage_name: str, context: dict) -> str:
    return (f"The dataset has no usable conversation: {match.group('why').strip().rstrip('.')}. Pick another "
            "dataset, add assistant replies, or raise max_seq_len if its conversations are longer.")


def _layers(match: re.Match, stage_name: str, context: dict) -> str:
    return f"The layer ids are outside this target: {_first_line(match.group(0))}. Change the layer ids."


def _quoted(prefix: str, suffix: str) -> Callable[[re.Match, str, dict], str]:
    def write(match: re.Match, stage_name: str, context: dict) -> str:
        return f"{prefix}{_first_line(match.string).rstrip('.')}{suffix}"
    return write


def _backend(match: re.Match, stage_name: str, context: dict) -> str:
    return (f"The {_stage(stage_name)} reached a worker that cannot run its backend: "
            f"{_first_line(match.string).rstrip('.')}. Start a worker that can, then Retry; or copy the run with "
            "another backend.")


def _lost(match: re.Match, stage_name: str, context: dict) -> str:
    return (f"The {_stage(stage_name)} lost its worker ({_first_line(match.string).rstrip('.')}). Nothing in "
            "the run is at fault: Retry.")


_DB = ("OperationalError", "InterfaceError")
_NETWORK = ("ConnectionError", "ConnectionRefusedError", "ConnectionResetError", "TimeoutError", "Timeout",
            "ReadTimeout", "ConnectTimeout", "NewConnectionError", "MaxRetryError", "RemoteDisconnected",
            "URLError", "ProtocolError")

RULES: tuple[Rule, ...] = (
    Rule(("OutOfMemoryError",), r"", TRANSIENT, "max_tokens_per_step", _oom),
    Rule((), r"CUDA out of memory|out of memory", TRANSIENT, "max_tokens_per_step", _oom),
    Rule((), r"stopped renewing its lease|worker lost", TRANSIENT, "", _lost),
    Rule(("TrainingProcessDied",), r"", TRANSIENT, "",
         _quoted("The training's process died (", "), most often killed for memory by the host. Retry, or lower "
                 "max_tokens_per_step if it happens again.")),
    # Routing sent it to the wrong worker (workers.contract.host.backends): one that can run it may come back.
    Rule(("BackendUnavailable",), r"", TRANSIENT, "extraction_backend", _backend, ("extract",)),
    Rule(("BackendUnavailable",), r"", TRANSIENT, "training_backend", _backend, ("train",)),
    Rule(("BackendUnavailable",), r"", TRANSIENT, "", _backend),
    Rule(_DB, r"", TRANSIENT, "", _quoted("The database was out of reach (", "). Retry once it answers.")),
    Rule(_NETWORK, r"", TRANSIENT, "", _quoted("A server did not answer (", "). Retry once it is up.")),
    # The demo's folder (`make demo`'s data/demo) unwritable or its disk full: fixed on the host, then the
    # launch page's "Build the demo target again" (runs.web.demo_views) redoes it.
    Rule(("OSError",), r"", UNKNOWN, "",
         _quoted("The demo target build could not write its files (", "). Make the folder writable or free "
                 "disk space, then build the demo target again."), ("demo_build",)),
    # A file of the run's folders linked out of the data roots since the launch (runs.data.paths): its own
    # words name the file (before the tokenizer's rule, which would blame a missing tokenizer.json instead).
    Rule((), r"is a symlink leading outside the allowed data roots", INPUTS, "",
         _quoted("", ". Replace the link with the file itself, or copy the run with another target or dataset.")),
    Rule((), r"Couldn't instantiate the backend tokenizer|Can't load tokenizer|tokenizer\.json", INPUTS,
         "target_path", _tokenizer, ("prepare", "extract", "evaluate", "train", "regenerate")),
    Rule(("InputError",), r"no training rows: (?P<why>.*)", INPUTS, "dataset_path", _no_rows),
    Rule(("InputError",), r"layer ids? .*outside this target.*", SETTINGS, "layer_ids", _layers),
    Rule(("ValueError",), r"max_seq_len must be", SETTINGS, "max_seq_len",
         _quoted("The maximum sequence length is refused (", "). Change max_seq_len.")),
    Rule(("FileNotFoundError",), r"dataset", INPUTS, "dataset_path",
         _quoted("The dataset file is gone (", "). Pick another dataset.")),
)

# An InputError's message already says what and where (workers.contract.errors); its field is
# guessed from the words it uses, most specific first.
_FIELD_WORDS = (("max_seq_len", "max_seq_len"), ("max_tokens_per_step", "max_tokens_per_step"),
                ("layer", "layer_ids"), ("draft_vocab_size", "draft_vocab_size"), ("vocab", "draft_vocab_size"),
                ("backend", "extraction_backend"), ("capture", "capture_urls"), ("tokenizer", "target_path"),
                ("chat template", "target_path"), ("config.json", "target_path"), ("target", "target_path"),
                ("dataset", "dataset_path"), ("conversation", "dataset_path"), ("line ", "dataset_path"))
_SETTING_FIELDS = {"max_seq_len", "max_tokens_per_step", "layer_ids", "draft_vocab_size", "extraction_backend",
                   "capture_urls"}


# The InputError subclasses the stages raise, by name: a failure stored as "Name: message" (an older row)
# has lost its class, and these stages import torch, which this module must not.
INPUT_ERROR_NAMES = frozenset({
    "InputError", "DatasetFormatError", "TargetConfigError", "VocabError", "ServeCheckError", "RegenerateError",
    "SplitError", "CacheIncomplete", "TrainInputError", "SplitDataError", "ChatTemplateError",
    "SpeculatorsLayoutError", "PreparedDatasetError", "EvaluationInputError", "TargetCannotChat",
    "CheckpointConfigError", "LayoutError", "ManifestError", "RegenerationRequestError", "RunConfigError",
    "ExportError", "PrepareMergeError",
})


def _input_field(message: str) -> str:
    lowered = message.lower()
    return next((field for word, field in _FIELD_WORDS if word in lowered), "")


def failure_explain(exc: BaseException, *, stage_name: str, context: dict | None = None) -> Failure:
    """The failure of `stage_name` that raised `exc`, in a user's words. `context` may name the run's
    `target` and `dataset` paths and its `max_tokens_per_step`, for the sentences that mention them."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return _explain(names, str(exc), stage_name=stage_name, context=context or {})


def failure_from_text(text: str, *, stage_name: str, context: dict | None = None) -> Failure:
    """A failure recorded as text alone (a lost lease, a refusal, an older row's "Type: message")."""
    match = re.match(r"(?P<type>[A-Z]\w*(?:Error|Exception|Died|Unavailable|Refused)): (?P<message>.*)", text.strip(),
                     re.DOTALL)
    names = {match.group("type")} if match else set()
    if names & INPUT_ERROR_NAMES:
        names.add("InputError")
    message = match.group("message") if match else text
    message = message.split("\n\nTraceback (most recent call last)")[0]
    return _explain(names, message, stage_name=stage_name, context=context or {})


def _explain(names: set[str], message: str, *, stage_name: str, context: dict) -> Failure:
    for rule in RULES:
        found = rule.match(names, message, stage_name)
        if found is not None:
            return Failure(sentence=rule.write(found, stage_name, context), kind=rule.kind, field=rule.field,
                           specific=True)
    if "InputError" in names or any(name.endswith(("InputError", "ConfigError", "FormatError")) for name in names):
        field = _input_field(message)
        kind = SETTINGS if field in _SETTING_FIELDS else INPUTS
        return Failure(sentence=_sentence(f"The {_stage(stage_name)} refused its input: {_first_line(message, 600)}"),
                       kind=kind, field=field)
    first = _first_line(message) or (sorted(names)[0] if names else "no message")
    return Failure(sentence=f"The {_stage(stage_name)} stopped: {first.rstrip('.')}. The full trace is in the "
                            "stage's details for developers.", kind=UNKNOWN)


def trace_for_developers(exc: BaseException) -> str:
    """Where the stage stopped, innermost frame last: the traceback's frames and the exception's own
    line (chained causes included), without Python's "Traceback (most recent call last)" banner,
    which the pages never show."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    # A child process's trace rides in a note (workers.stages.train.processes.in_child), banner and all.
    kept = [line for line in text.splitlines(keepends=True) if not line.strip().startswith(BANNER)]
    return "Frames, innermost last:\n" + "".join(kept)


BANNER = "Traceback (most recent call last)"


def failure_headline(error: str, *, stage_name: str) -> str:
    """The error a page shows: an older row that stored "Type: message" and the traceback reads as
    its sentence; a newer row's error is already one."""
    if BANNER not in error:
        return error
    return failure_from_text(error, stage_name=stage_name).sentence


def failure_details(error: str, trace: str) -> str:
    """The details for developers: the stored frames, or an older row's traceback without its banner."""
    if trace or BANNER not in error:
        return trace
    kept = [line for line in error.split(BANNER, 1)[1].lstrip(":\n").splitlines(keepends=True)
            if not line.strip().startswith(BANNER)]
    return "Frames, innermost last:\n" + "".join(kept)


def log_shown(log: str) -> str:
    """A stage's log as the pages show it: an older row's log kept Python's traceback banner, which
    newer logs leave out (workers.orchestration.stage_runners); the frames below it stay."""
    if BANNER not in log:
        return log
    return "\n".join(line for line in log.splitlines() if not line.strip().startswith(BANNER))
