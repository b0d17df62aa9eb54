"""Evaluation suites (issue 39): named prompt sets a run measures every checkpoint on, besides its held-out
prompts (runs.pipeline.launch.setting_bounds.HELD_OUT). A suite is registered by the first launch that names it
with a chat file under the data roots; a later launch names it again by the same path, or by its name alone. The
evaluate stage measures each (workers.orchestration.stage_runners), the best is chosen by one or a mix
(runs.pipeline.best)."""
from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser

from runs.data.paths import PathNotAllowed, check_under_data_roots
from runs.data.models import EvalSuite
from runs.pipeline.launch.setting_bounds import RunConfigError
from workers.contract.chats.jsonl import read_conversations
from workers.contract.errors import InputError


def _suite_file(name: str, raw: str) -> Path:
    """The resolved chat file, refused naming the suite when outside the data roots, not a file, empty or
    without a conversation to prompt from."""
    where = f"eval_suites[{name}]"
    try:
        path = check_under_data_roots(raw, kind=f"{where} file")
    except PathNotAllowed as exc:
        raise RunConfigError(f"{where}: {exc}", field="eval_suites") from None
    if not path.is_file():
        raise RunConfigError(f"{where}: {path} is not a file (give a chat JSONL file)", field="eval_suites")
    if path.stat().st_size == 0:
        raise RunConfigError(f"{where}: {path} is empty (0 bytes): give a chat JSONL file, one conversation a line",
                             field="eval_suites")
    try:
        first = next(iter(read_conversations(path)), None)
    except InputError as exc:
        raise RunConfigError(f"{where}: {exc}", field="eval_suites") from None
    if first is None:
        raise RunConfigError(f"{where}: {path} holds only blank lines: no prompt to measure on", field="eval_suites")
    return path


def eval_suites_register(*, suites: dict[str, str], user: AbstractBaseUser | None) -> dict[str, str]:
    """{name: resolved path} for a launch: each suite given with a path is checked and registered (or must
    be the path registered under that name); one given by name alone must be registered. Called inside the
    launch's transaction: a refusal stores nothing."""
    resolved = {}
    for name, raw in suites.items():
        known = EvalSuite.objects.filter(name=name).first()
        if known is not None and known.retired:
            raise RunConfigError(f"eval_suites[{name}] is retired (admin): choose another suite", field="eval_suites")
        if not raw:
            if known is None:
                names = ", ".join(EvalSuite.objects.filter(retired=False).values_list("name", flat=True)) or "none yet"
                raise RunConfigError(f"eval_suites[{name}]: unknown suite (registered: {names}); give NAME=PATH to "
                                     "register it", field="eval_suites")
            raw = known.path
        path = _suite_file(name, raw)
        if known is None:
            EvalSuite.objects.create(name=name, path=str(path), size_bytes=path.stat().st_size, created_by=user)
        elif Path(known.path) != path:
            raise RunConfigError(f"eval_suites[{name}] is registered as {known.path}, not {path}: give that path, "
                                 "the name alone, or another name", field="eval_suites")
        resolved[name] = str(path)
    return resolved
