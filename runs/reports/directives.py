"""The blocks a report embeds, written as a line of their own in its Markdown:

    {{chart run=12,14 metric=loss}}              the runs' curves of one metric (family or exact key)
    {{table runs=12,14 columns=tau,best_epoch}}   a row per run, a column per name
    {{generations checkpoint=33 prompts=4}}       a checkpoint's held-out generations

Parsing only (no database): a line either parses into a Directive or into a DirectiveError whose
message names what was wrong (the directive, the parameter, the value), shown where the block would be."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from runs.tracking.metric_names import RULE, is_metric_name

# A directive is a whole line: text around it would be lost in the block.
LINE_RE = re.compile(r"^\s{0,3}\{\{(.*)\}\}\s*$")
FENCE_RE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
NAME_RE = re.compile(r"[a-z_]{1,30}")
MAX_RUNS = 10  # what one chart or table shows, as compare does
MAX_PROMPTS = 32
DEFAULT_PROMPTS = 4
SPLITS = ("train", "val")
# A table's columns: what the runs list shows of a run, and the settings it ran with (its config's names,
# learning_rate for lr as the launch form words it).
RUN_COLUMNS = ("name", "status", "owner", "created", "tau", "best_epoch", "epochs", "target", "dataset")
SETTING_COLUMNS = {"learning_rate": "lr", "lr": "lr", "max_seq_len": "max_seq_len", "max_samples": "max_samples",
                   "draft_vocab_size": "draft_vocab_size", "ttt_steps": "ttt_steps", "val_fraction": "val_fraction",
                   "seed": "seed", "layer_ids": "layer_ids", "max_tokens_per_step": "max_tokens_per_step",
                   "extraction_backend": "extraction_backend", "training_backend": "training_backend",
                   "best_by": "best_by"}
COLUMNS = RUN_COLUMNS + tuple(name for name in SETTING_COLUMNS if name != "lr")
DEFAULT_COLUMNS = ("name", "status", "tau", "best_epoch", "learning_rate")
PARAMS = {"chart": {"run": "runs", "runs": "runs", "metric": "metric", "split": "split"},
          "table": {"run": "runs", "runs": "runs", "columns": "columns"},
          "generations": {"checkpoint": "checkpoint", "prompts": "prompts"}}
KINDS = tuple(PARAMS)


class DirectiveError(Exception):
    """A directive line that names no block we can draw; the message says which part and why."""


@dataclass(frozen=True)
class Directive:
    kind: str  # chart, table, generations
    source: str  # the line as typed, for error messages and the export
    runs: tuple[int, ...] = ()
    metric: str = ""
    split: str = ""
    columns: tuple[str, ...] = ()
    checkpoint: int | None = None
    prompts: int = DEFAULT_PROMPTS
    params: dict = field(default_factory=dict, compare=False)


def _ids(kind: str, name: str, text: str, *, most: int) -> tuple[int, ...]:
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or len(part) > 18:
            raise DirectiveError(f"{kind}: {name}={text[:60]} — {part[:30]!r} is not an id")
        if int(part) not in ids:
            ids.append(int(part))
    if not 1 <= len(ids) <= most:
        raise DirectiveError(f"{kind}: {name}= names {len(ids)} ids; 1 to {most}")
    return tuple(ids)


def _params(kind: str, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in text.split():
        name, sep, value = token.partition("=")
        if not sep or not value:
            raise DirectiveError(f"{kind}: {token[:60]!r} is not name=value")
        if name not in PARAMS[kind]:
            raise DirectiveError(f"{kind}: unknown parameter {name[:30]!r} (known: {', '.join(dict.fromkeys(PARAMS[kind]))})")
        canonical = PARAMS[kind][name]
        if canonical in out:
            raise DirectiveError(f"{kind}: {name} is given twice")
        out[canonical] = value
    return out


def directive_parse(line: str) -> Directive:
    """The directive of a `{{...}}` line; DirectiveError naming the part that is wrong."""
    match = LINE_RE.match(line)
    if match is None:
        raise DirectiveError(f"{line.strip()[:80]!r} is not a {{{{...}}}} line")
    inner = match[1].strip()
    kind, _, rest = inner.partition(" ")
    if not NAME_RE.fullmatch(kind) or kind not in PARAMS:
        raise DirectiveError(f"unknown directive {kind[:40]!r} (known: {', '.join(KINDS)})")
    params = _params(kind, rest)
    source = line.strip()
    if kind == "chart":
        for required in ("runs", "metric"):
            if required not in params:
                raise DirectiveError(f"chart: {'run' if required == 'runs' else required}= is missing")
        if not is_metric_name(params["metric"]):
            raise DirectiveError(f"chart: metric={params['metric'][:60]} is not a metric name ({RULE})")
        split = params.get("split", "")
        if split and split not in SPLITS:
            raise DirectiveError(f"chart: split={split[:20]} — train or val (or leave it out for both)")
        return Directive(kind, source, runs=_ids(kind, "run", params["runs"], most=MAX_RUNS),
                         metric=params["metric"], split=split, params=params)
    if kind == "table":
        if "runs" not in params:
            raise DirectiveError("table: runs= is missing")
        columns = tuple(c for c in params.get("columns", ",".join(DEFAULT_COLUMNS)).split(",") if c)
        for column in columns:
            if column not in COLUMNS:
                raise DirectiveError(f"table: unknown column {column[:40]!r} (known: {', '.join(COLUMNS)})")
        return Directive(kind, source, runs=_ids(kind, "runs", params["runs"], most=MAX_RUNS),
                         columns=tuple(dict.fromkeys(columns)), params=params)
    if "checkpoint" not in params:
        raise DirectiveError("generations: checkpoint= is missing")
    checkpoint = _ids(kind, "checkpoint", params["checkpoint"], most=1)[0]
    prompts = params.get("prompts", str(DEFAULT_PROMPTS))
    if not (prompts.isascii() and prompts.isdigit()) or not 1 <= int(prompts) <= MAX_PROMPTS:
        raise DirectiveError(f"generations: prompts={prompts[:20]} — a number from 1 to {MAX_PROMPTS}")
    return Directive(kind, source, checkpoint=checkpoint, prompts=int(prompts), params=params)


def directive_lines(body: str) -> list[tuple[int, str]]:
    """(line index, line) of every directive line of the Markdown, outside fenced code (a report may
    quote a directive in a ``` block to show how it is written)."""
    out, fence = [], ""
    for index, line in enumerate(body.splitlines()):
        opened = FENCE_RE.match(line)
        if fence:
            if opened and opened[1][0] == fence[0] and len(opened[1]) >= len(fence):
                fence = ""
            continue
        if opened:
            fence = opened[1]
            continue
        if LINE_RE.match(line):
            out.append((index, line))
    return out
