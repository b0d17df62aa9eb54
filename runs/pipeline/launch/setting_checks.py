"""Checks and parsers of one setting each: a run's name, its layer ids, the serve check's concurrencies, suite
names and NAME=VALUE pairs; RunConfig calls the checks, the form and the CLI the parsers on what was typed."""
from __future__ import annotations

import unicodedata

from runs.pipeline.launch.setting_bounds import (DEFAULT_SERVE_CONCURRENCY, MAX_LAYER_IDS, MAX_LAYER_IDS_TEXT,
                                                 MAX_NAME_CHARS, MAX_SERVE_CONCURRENCY, MAX_SERVE_LEVELS,
                                                 MIN_SERVE_CONCURRENCY, SUITE_NAME_CHARS, RunConfigError)
from workers.contract.target import MAX_NUM_LAYERS


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
