"""A byte-bounded folder of captured samples, least recently used evicted first.

The files are an extraction's (`hs_{i}.safetensors`: `hidden_states` [T, L, H] bf16, `token_ids`
int64 [T]), so the training dataset reads them as it reads an extraction and checks them the same
way. Room for a sample is reserved when it is asked for (evicting then), so the folder, with the
files capture servers are still writing into it (their staging folders under it), stays under the
limit. All accounting is one lock's: a reservation turns into its file's bytes in the same step that
puts the file in place, so a reserve running beside a put always sees the one or the other. Rows the
trainer will read soon are pinned (fetched ahead, not yet read): eviction never takes them, which is
why the prefetch window is bounded by the cache's room (workers.stages.train.online.samples).
Files an earlier attempt left are adopted (oldest first in the LRU order); each is checked again
when it is read, as every cached sample is.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

SAMPLE_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
SERVED_NAME = "served.json"


class CacheFullError(RuntimeError):
    """A sample does not fit beside the pinned ones: the cache limit is too small for the prefetch window.
    It is about the run's setting, not a capture server: the capture client lets it through unretried."""


class SampleCache:
    def __init__(self, directory: Path, *, limit_bytes: int):
        if limit_bytes <= 0:
            raise ValueError(f"the hidden-states cache needs a positive size limit, got {limit_bytes} bytes")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._sizes: OrderedDict[int, int] = OrderedDict()  # row -> bytes, least recently used first
        self._pins: dict[int, int] = {}
        self._reserved: dict[int, int] = {}  # row -> bytes set aside for a sample being captured or moved in
        self._reserved_total = 0
        self.bytes = 0  # the files the cache holds
        self.peak_bytes = 0  # the most held and set aside at once: what the folder on disk can have reached
        self.evictions = 0
        self.served: dict[str, dict] = {}  # row -> {"server": url, "tokens": n}, for the run's manifest
        self._adopt()

    def _adopt(self) -> None:
        found = []
        for entry in os.scandir(self.dir):
            match = SAMPLE_NAME.match(entry.name)
            if match and entry.is_file():
                stat = entry.stat()
                found.append((stat.st_mtime_ns, int(match.group(1)), stat.st_size))
            elif entry.name.endswith(".part"):
                os.unlink(entry.path)  # a copy a killed attempt left half-written
        for _mtime, row, size in sorted(found):
            self._sizes[row] = size
            self.bytes += size
        self.peak_bytes = self.bytes
        served = self.dir / SERVED_NAME
        if served.is_file():
            try:
                self.served = json.loads(served.read_text()).get("samples", {})
            except (OSError, ValueError, AttributeError):
                self.served = {}
        with self._lock:
            self._evict_locked(0)

    def path(self, row: int) -> Path:
        return self.dir / f"hs_{row}.safetensors"

    def has(self, row: int) -> bool:
        with self._lock:
            return row in self._sizes

    def touch(self, row: int) -> bool:
        """Mark row as just used; False when the cache does not hold it."""
        with self._lock:
            if row not in self._sizes:
                return False
            self._sizes.move_to_end(row)
            return True

    def pin(self, row: int) -> None:
        with self._lock:
            self._pins[row] = self._pins.get(row, 0) + 1

    def unpin(self, row: int) -> None:
        with self._lock:
            left = self._pins.get(row, 0) - 1
            if left > 0:
                self._pins[row] = left
            else:
                self._pins.pop(row, None)

    def pinned_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.get(row, 0) for row in self._pins)

    def reserve(self, row: int, nbytes: int) -> None:
        """Set room aside for row's coming sample, evicting unpinned rows as needed; CacheFullError
        when the pinned rows and the other reservations leave no room."""
        with self._lock:
            self._evict_locked(nbytes)
            self._set_reserved_locked(row, self._reserved.get(row, 0) + nbytes)

    def release(self, row: int) -> None:
        """Give back row's reservation (its capture failed, and its file, if any, is gone)."""
        with self._lock:
            self._set_reserved_locked(row, 0)

    def put(self, row: int, source: Path, *, server: str, tokens: int) -> Path:
        """Move a checked sample file into the cache as row's. Row's reservation becomes the file's
        exact size first (evicting least recently used unpinned rows when the file is larger), and the
        file is moved in and counted as held in one step under the lock. A file on another filesystem
        (a capture server's folder elsewhere) is copied to a .part name first, within the reservation,
        so a row's file is whole or absent. CacheFullError leaves the reservation as it was: the
        caller deletes the file, then releases it."""
        size = Path(source).stat().st_size
        target = self.path(row)
        with self._lock:
            held = self._reserved.get(row, 0)
            if size > held:
                self._evict_locked(size - held)
            self._set_reserved_locked(row, size)
            try:
                os.replace(source, target)
                moved = True
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    self._set_reserved_locked(row, held)
                    raise
                moved = False
            if moved:
                self._hold_locked(row, size, server=server, tokens=tokens)
                return target
        part = target.with_name(target.name + ".part")  # another filesystem: copied within the reservation
        try:
            shutil.copyfile(source, part)
            with self._lock:
                os.replace(part, target)
                self._hold_locked(row, size, server=server, tokens=tokens)
        except BaseException:
            part.unlink(missing_ok=True)
            with self._lock:
                self._set_reserved_locked(row, held)
            raise
        os.unlink(source)
        return target

    def _set_reserved_locked(self, row: int, nbytes: int) -> None:
        self._reserved_total += nbytes - self._reserved.pop(row, 0)
        if nbytes:
            self._reserved[row] = nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes + self._reserved_total)

    def _hold_locked(self, row: int, size: int, *, server: str, tokens: int) -> None:
        """Row's file is in place: its reservation (already its size) becomes bytes held, in one step."""
        self._set_reserved_locked(row, 0)
        self.bytes += size - self._sizes.pop(row, 0)
        self._sizes[row] = size
        self.peak_bytes = max(self.peak_bytes, self.bytes + self._reserved_total)
        self.served[str(row)] = {"server": server, "tokens": tokens}

    def _evict_locked(self, incoming: int) -> None:
        reserved = self._reserved_total
        for row in list(self._sizes):
            if self.bytes + reserved + incoming <= self.limit_bytes:
                return
            if row in self._pins:
                continue
            size = self._sizes.pop(row)
            try:
                os.unlink(self.path(row))
            except FileNotFoundError:
                pass
            self.bytes -= size
            self.evictions += 1
        if self.bytes + reserved + incoming > self.limit_bytes:
            raise CacheFullError(
                f"{incoming:,} more bytes for a sample do not fit in the hidden-states cache ({self.limit_bytes:,} "
                f"bytes: {self.bytes:,} held by rows the trainer reads next, {reserved:,} set aside for samples being "
                "captured): raise hidden_states_cache_gib")

    def write_served(self) -> None:
        """served.json: which capture server produced each row the cache has held (the run's manifest)."""
        with self._lock:
            body = {"samples": dict(self.served), "limit_bytes": self.limit_bytes, "peak_bytes": self.peak_bytes,
                    "evictions": self.evictions}
        tmp = self.dir / (SERVED_NAME + ".tmp")
        tmp.write_text(json.dumps(body, sort_keys=True))
        os.replace(tmp, self.dir / SERVED_NAME)
