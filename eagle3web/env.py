"""Typed readers for environment variables: a bad value stops start-up with a message naming it."""
from __future__ import annotations

import os
from pathlib import Path


class EnvError(ValueError):
    pass


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None


def env_list(name: str, default: list[str], sep: str = ",") -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [part.strip() for part in raw.split(sep) if part.strip()]


def env_paths(name: str, default: list[Path]) -> list[Path]:
    """Colon-separated absolute directories, resolved so that symlinks cannot widen them later."""
    raw = os.environ.get(name)
    if raw is None:
        return [p.resolve() for p in default]
    paths = []
    for part in raw.split(":"):
        if not part.strip():
            continue
        path = Path(part.strip()).expanduser()
        if not path.is_absolute():
            raise EnvError(f"{name}: {part!r} is not an absolute path")
        paths.append(path.resolve())
    if not paths:
        raise EnvError(f"{name} is set but names no directory")
    return paths
