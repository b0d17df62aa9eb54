"""Opening a file a user or the API named: only a regular file, never waiting on what is not one.

`open()` of a FIFO blocks until a writer appears (a web request hung on `mkfifo D/config.json`
registered as a checkpoint), and a device such as /dev/zero reads forever. The file is opened with
O_NONBLOCK (which returns at once for a FIFO with no writer) and O_NOCTTY, checked with fstat on the
descriptor itself (no race with a swap of the path), and handed back in blocking mode.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class NotARegularFile(OSError):
    """The path names something that is not a regular file; the message says what it is."""


def open_regular(path: Path | str) -> BinaryIO:
    """The file at `path` opened for binary reading, or NotARegularFile (FileNotFoundError and other
    OSErrors as open() raises them)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotARegularFile(f"{path} is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def special_entries(directory: Path | str) -> list[str]:
    """What in `directory` (not below it) is a FIFO, device or socket: a loader that opens every file
    there (from_pretrained, say) would block on one. lstat only: nothing is opened."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            kind = _KINDS.get(stat.S_IFMT(mode))
            if kind is not None and not stat.S_ISDIR(mode):
                found.append(f"{entry.name} is {kind}")
    return sorted(found)
