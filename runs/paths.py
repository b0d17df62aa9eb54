"""Paths that users type are confined to EAGLE3WEB_DATA_ROOTS, symlinks resolved first."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings

from workers.stages.errors import InputError


class PathNotAllowed(InputError):
    pass


def check_under_data_roots(raw: str | Path, *, must_exist: bool = True, kind: str = "path") -> Path:
    """Return the resolved path, or raise naming the path and the roots it must lie under."""
    text = str(raw).strip()
    if not text:
        raise PathNotAllowed(f"the {kind} is empty")
    path = Path(text).expanduser()
    if not path.is_absolute():
        raise PathNotAllowed(f"{kind} {text!r} must be an absolute path")
    resolved = path.resolve()
    roots = settings.EAGLE3WEB_DATA_ROOTS
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        via = f" (it resolves to {resolved} through a symlink)" if resolved != path else ""
        allowed = ", ".join(str(r) for r in roots)
        raise PathNotAllowed(
            f"{kind} {text} is outside the allowed data roots{via}; allowed: {allowed} "
            f"(set EAGLE3WEB_DATA_ROOTS to change them)"
        )
    if must_exist and not resolved.exists():
        raise PathNotAllowed(f"{kind} {text} does not exist")
    return resolved
