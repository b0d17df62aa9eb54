"""The files of one regeneration and how a retried attempt resumes them.

The job can be killed at any moment, so nothing is held only in memory: `<out>.partial` gets one whole
conversation per line (flushed and fsynced), `<out>.failures.jsonl` one {"id", "line", "error"} per conversation
that cannot be answered, and `<out>.meta.json`, written first, what decides the replies (source bytes,
target, backend, sampling settings). A later attempt with the same meta drops a torn last line, keeps
every whole line and skips their ids; failures are not retried (the same prompt fails the same way).
When every conversation is done the partial file is renamed to `<out>` (atomic), and a call that finds
`<out>` already made with the same meta takes it up again, so calling twice returns the same result.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from workers.stages.regenerate.base import RegenerateError, Tally

log = logging.getLogger(__name__)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonlAppender:
    """Appends one JSON object per line, each on disk (fsync) before the next is written."""

    def __init__(self, path: Path):
        self.fh = open(path, "ab")

    def write(self, entry: dict) -> None:
        self.fh.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def _read_whole_lines(path: Path, valid: Callable[[dict], bool]) -> tuple[list[dict], int]:
    """(the entries of the whole, valid lines up to the first that is not, where that line starts)."""
    entries, good_end = [], 0
    if not path.is_file():
        return entries, 0
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # torn by a kill mid-write
            try:
                entry = json.loads(line)
            except ValueError:
                break
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not valid(entry):
                break
            entries.append(entry)
            good_end += len(line)
    return entries, good_end


def _keep_only(path: Path, entries: list[dict], keep: list[bool], good_end: int) -> None:
    """Cut the file to its whole lines, and rewrite it (atomically) when some of them must go."""
    if all(keep):
        if path.is_file() and path.stat().st_size != good_end:
            log.info("%s: dropping a torn last line (%d bytes) left by a killed attempt", path, path.stat().st_size - good_end)
            with open(path, "r+b") as fh:
                fh.truncate(good_end)
                os.fsync(fh.fileno())
        return
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        for entry, kept in zip(entries, keep):
            if kept:
                fh.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    log.info("%s: kept %d of its %d lines (the others are no longer chosen, or repeat an id)", path, sum(keep), len(keep))


class OutputFiles:
    def __init__(self, out_path: Path):
        self.out = Path(out_path)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.failures = self.out.with_name(self.out.name + ".failures.jsonl")
        self.meta = self.out.with_name(self.out.name + ".meta.json")
        self.written: set[str] = set()
        self.failed: set[tuple[str, int]] = set()  # (id, line): a repeated id fails on its own line
        self._appenders: list[JsonlAppender] = []

    def begin(self, identity: dict) -> None:
        """Take up an earlier attempt's files when it regenerated with the same identity; else start afresh."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        try:
            earlier = json.loads(self.meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = None
        if earlier == identity:
            if self.out.is_file() and not self.partial.exists():
                os.replace(self.out, self.partial)  # a finished file: resumed as a whole, renamed back at the end
            return
        if self.out.exists():
            raise RegenerateError(f"{self.out} exists and was not written by this regeneration (another source, "
                                  "target or settings); remove it or write elsewhere")
        for stale in (self.partial, self.failures):
            if stale.exists():
                log.warning("%s: an earlier attempt with other settings wrote it; starting afresh", stale)
                stale.unlink()
        tmp = self.meta.with_name(self.meta.name + ".tmp")
        tmp.write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.meta)
        _fsync_dir(self.out.parent)

    def load(self, chosen: set[str]) -> Tally:
        """What earlier attempts wrote, counted from their lines; lines of conversations no longer chosen
        (other exclusions, a smaller max_samples) or repeating an id are dropped from the files."""
        tally = Tally()
        entries, good_end = _read_whole_lines(self.partial, lambda e: isinstance(e.get("regenerated"), dict))
        keep = []
        for entry in entries:
            keep.append(entry["id"] in chosen and entry["id"] not in self.written)
            if keep[-1]:
                self.written.add(entry["id"])
                tally.add_written(entry["regenerated"])
        _keep_only(self.partial, entries, keep, good_end)
        entries, good_end = _read_whole_lines(
            self.failures, lambda e: isinstance(e.get("error"), str) and type(e.get("line")) is int)
        keep = []
        for entry in entries:
            keep.append(entry["id"] in chosen and (entry["id"], entry["line"]) not in self.failed)
            if keep[-1]:
                self.failed.add((entry["id"], entry["line"]))
                tally.add_failure(entry)
        _keep_only(self.failures, entries, keep, good_end)
        return tally

    def done(self, source_id: str, line: int, *, repeated: bool = False) -> bool:
        """Whether an earlier attempt wrote this conversation or failed it (a `repeated` id's line is
        only ever failed: its id was written for the line that had it first)."""
        return (not repeated and source_id in self.written) or (source_id, line) in self.failed

    def open(self) -> tuple[JsonlAppender, JsonlAppender]:
        """(rows, failures) appenders; both files exist from here on."""
        self._appenders = [JsonlAppender(self.partial), JsonlAppender(self.failures)]
        return self._appenders[0], self._appenders[1]

    def close(self) -> None:
        for appender in self._appenders:
            appender.close()
        self._appenders = []

    def finish(self) -> None:
        """The partial file becomes the output (atomic rename), on disk before this returns."""
        self.close()
        os.replace(self.partial, self.out)
        _fsync_dir(self.out.parent)
