"""Paths that users type are confined to EAGLE3WEB_DATA_ROOTS, symlinks resolved first.

Bounded input, checked before the file system is touched:

* MAX_PATH_CHARS (1000): the whole path, as typed and as resolved. Resolved paths are stored in
  1000-character columns (TargetModel.path, Dataset.path, Extraction.path, ...), well under
  Linux's PATH_MAX of 4096.
* MAX_COMPONENT_BYTES (255): one component (file or directory name) in UTF-8 bytes, the limit of
  ext4, XFS, btrfs and most other file systems (NAME_MAX).
* No NUL or other control characters, and no text that is not encodable as UTF-8.
* Any OSError the operating system raises while resolving (ENAMETOOLONG, ELOOP, EACCES, ...)
  becomes PathNotAllowed naming the path.

A folder is confined with what it holds: every file and folder in it, at any depth (a target's config.json,
tokenizer and weights, an extraction's shards), resolves inside the roots too. A symlink leading out is refused
naming the file, before anything reads it (a loader such as from_pretrained opens whatever the folder's names
lead to); a symlink staying inside the roots is followed, and what it leads to is checked the same way.
"""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from django.conf import settings

from workers.contract.errors import InputError

MAX_PATH_CHARS = 1000
MAX_COMPONENT_BYTES = 255
MAX_CHECKED_ENTRIES = 1_000_000  # in a named folder, at any depth: ~1 s of directory reading
SHOWN_CHARS = 300  # how much of a refused path a message repeats


class PathNotAllowed(InputError):
    pass


def shown_path(text: str, limit: int = SHOWN_CHARS) -> str:
    """The path for a message: control characters escaped, cut to `limit` characters."""
    text = str(text)
    head = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return head + "..." if len(text) > limit else head


def _check_text(text: str, kind: str) -> None:
    shown = shown_path(text)
    if len(text) > MAX_PATH_CHARS:
        raise PathNotAllowed(f"{kind} is {len(text)} characters long; the limit is {MAX_PATH_CHARS} ({shown})")
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        name = "a NUL byte" if bad == "\x00" else f"the control character {bad!r}"
        raise PathNotAllowed(f"{kind} {shown} contains {name}; paths may not hold control characters")
    for part in text.split("/"):
        size = len(part.encode("utf-8"))
        if size > MAX_COMPONENT_BYTES:
            raise PathNotAllowed(
                f"{kind} {shown}: the name {shown_path(part, 40)} is {size} bytes long; file systems allow "
                f"at most {MAX_COMPONENT_BYTES} bytes per name"
            )


def _inside(path: Path, roots) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _confine_contents(folder: Path, roots, *, kind: str, shown: str) -> None:
    """Refuse, naming it, the first name under `folder` that resolves outside `roots`. lstat only, from the
    directory entries: no file is opened. A folder reached twice (a symlink loop inside the roots) is walked
    once; past MAX_CHECKED_ENTRIES (a data root named as a target, say) the folder is refused, not half checked."""
    seen, pending, count = {folder}, [(folder, "")], 0
    while pending:
        directory, prefix = pending.pop()
        try:
            with os.scandir(directory) as entries:
                found = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue  # an unreadable folder: nothing in it can be read either
        count += len(found)
        if count > MAX_CHECKED_ENTRIES:
            raise PathNotAllowed(f"{kind} {shown} holds more than {MAX_CHECKED_ENTRIES:,} files and folders, too many "
                                 "to check that each stays inside the data roots; name the folder itself")
        for entry in found:
            name = f"{prefix}{entry.name}"
            if entry.is_symlink():
                try:
                    target = Path(entry.path).resolve(strict=True)
                except (OSError, RuntimeError):  # dangling, or a loop: leads nowhere, so nothing is read through it
                    continue
                if not _inside(target, roots):
                    raise PathNotAllowed(
                        f"{kind} {shown}: {shown_path(name)} is a symlink leading outside the allowed data roots "
                        f"(where it leads is not shown); copy the file into the folder, or link to one inside: "
                        f"{', '.join(map(str, roots))}")
                if target.is_dir() and target not in seen:
                    seen.add(target)
                    pending.append((target, f"{name}/"))
            elif entry.is_dir(follow_symlinks=False):
                pending.append((Path(entry.path), f"{name}/"))


def check_under_data_roots(raw: str | Path, *, must_exist: bool = True, kind: str = "path") -> Path:
    """Return the resolved path, or raise naming the path and the roots it must lie under."""
    text = str(raw).strip()
    if not text:
        raise PathNotAllowed(f"the {kind} is empty")
    _check_text(text, kind)
    shown = shown_path(text)
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # "~someone" whose home cannot be found
        raise PathNotAllowed(f"{kind} {shown}: cannot expand '~' here; give an absolute path") from None
    if not path.is_absolute():
        raise PathNotAllowed(f"{kind} {shown} must be an absolute path")
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on Python < 3.13
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise PathNotAllowed(f"{kind} {shown} cannot be resolved ({reason})") from None
    if len(str(resolved)) > MAX_PATH_CHARS:
        raise PathNotAllowed(f"{kind} {shown} resolves to a path longer than {MAX_PATH_CHARS} characters "
                             f"({shown_path(str(resolved))})")
    roots = settings.EAGLE3WEB_DATA_ROOTS
    if not _inside(resolved, roots):
        # Where a symlink leads is not quoted: a refusal must not tell what lies outside the roots
        # (a probe had it print a path under /proc).
        via = " (through a symlink or '..'; where it leads is not shown)" if resolved != path else ""
        allowed = ", ".join(str(r) for r in roots)
        raise PathNotAllowed(
            f"{kind} {shown} is outside the allowed data roots{via}; allowed: {allowed} "
            f"(set EAGLE3WEB_DATA_ROOTS to change them)"
        )
    if must_exist:
        try:
            exists = resolved.exists()
        except OSError as exc:
            raise PathNotAllowed(f"{kind} {shown} cannot be checked ({exc.strerror or exc})") from None
        if not exists:
            raise PathNotAllowed(f"{kind} {shown} does not exist")
        if resolved.is_dir():
            _confine_contents(resolved, roots, kind=kind, shown=shown)
    return resolved
