"""Taking a capture server's file out of its staging folder without trusting the path it names.

A capture server answers each request with the path of the hidden-states file it wrote
(`kv_transfer_params.hidden_states_path`). That answer is untrusted input: a server at a URL a launcher
named could name any file this worker can read or delete. So a path is taken only when, spelled as it is
(no `.`/`..`, absolute), it lies under the staging folder this worker created for the server (a started
server's own folder; for a server given by URL, EAGLE3WEB_CAPTURE_STAGING_DIR, where its operator points
its connector's shared_storage_path), and every folder on the way is a real folder, walked with
O_NOFOLLOW from the staging folder's own descriptor: a symlink anywhere (a folder or the file itself) is
refused. The file is then renamed (rename moves a link, never follows one) into a folder of the run's
that no server writes into and checked again there, so nothing the server swaps in afterwards is read.
The `.lock` beside it is opened and removed the same way. Nothing outside the staging folder is opened,
read or removed; a refusal names the server and the path (a bounded, escaped excerpt).
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import os
import shutil
import stat
import time
from pathlib import Path

from workers.contract.inputs.host_rule import excerpt
from workers.stages.extract.with_vllm import VllmOutputError

SUFFIX = ".safetensors"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_taken = itertools.count()


class CaptureRefused(VllmOutputError):
    """A server's sample disagrees with the run (layers, target, token ids, values, or a path outside its
    staging folder); names the sample and the server."""


def _parts_under(handle: object, staging: Path, *, server: str) -> list[str]:
    """The path's parts below `staging`, refused unless it is plainly spelled beneath it."""
    def refuse(why: str) -> CaptureRefused:
        return CaptureRefused(f"capture server {server} named {excerpt(handle, 200)} as its hidden-states file: "
                              f"{why}; it must write into {staging} (its connector's shared_storage_path), and "
                              "nothing elsewhere is opened or removed")

    if not isinstance(handle, str) or not handle or "\x00" in handle:
        raise refuse("not a file path")
    if not handle.startswith("/"):
        raise refuse("not an absolute path")
    raw = handle.split("/")[1:]
    if any(part in (".", "..") for part in raw):
        raise refuse("a path with '.' or '..' in it")
    parts = [part for part in raw if part]
    base = [part for part in str(staging).split("/") if part]
    if len(parts) <= len(base) or parts[:len(base)] != base:
        raise refuse(f"outside the staging folder {staging}")
    below = parts[len(base):]
    if not below[-1].endswith(SUFFIX) or below[-1] == SUFFIX:
        raise refuse(f"not a {SUFFIX} file")
    return below


def _open_folder(staging: Path, folders: list[str], *, server: str, handle: str) -> int:
    fd = os.open(staging, _DIR_FLAGS)
    try:
        for name in folders:
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                raise CaptureRefused(f"capture server {server} named {excerpt(handle, 200)}: {excerpt(name, 60)} "
                                     f"under {staging} is not a folder (a symlink is refused)") from None
            os.close(fd)
            fd = inner
        return fd
    except BaseException:
        os.close(fd)
        raise


def _lstat(name: str, fd: int) -> os.stat_result | None:
    try:
        found = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return found


def _wait_for_lock(name: str, folder: int, *, timeout_s: float, server: str, handle: str) -> None:
    """The connector's writer holds `name` (LOCK_EX) until the file is whole; wait for it, then remove it."""
    found = _lstat(name, folder)
    if found is None:
        return
    if not stat.S_ISREG(found.st_mode):
        raise CaptureRefused(f"capture server {server}: the lock beside {excerpt(handle, 200)} is not a plain file "
                             "(a symlink is refused)")
    lock = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for the lock beside "
                                       f"{excerpt(handle, 200)}") from None
                time.sleep(0.05)
    finally:
        os.close(lock)
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def take_sample(handle: object, *, staging: Path, taken_dir: Path, server: str, lock_timeout_s: float) -> Path:
    """The file `handle` names, moved into `taken_dir` (the run's own) once checked: under `staging`, no
    symlink on the way, a plain file. CaptureRefused names the server otherwise, and nothing is touched."""
    below = _parts_under(handle, staging, server=server)
    assert isinstance(handle, str)
    taken_dir.mkdir(parents=True, exist_ok=True)
    name = below[-1]
    folder = _open_folder(staging, below[:-1], server=server, handle=handle)
    try:
        _wait_for_lock(f"{name}.lock", folder, timeout_s=lock_timeout_s, server=server, handle=handle)
        found = _lstat(name, folder)
        if found is None:
            raise FileNotFoundError(f"capture server {server} named {excerpt(handle, 200)}, which is not there: "
                                    "does this worker share the server's filesystem?")
        if not stat.S_ISREG(found.st_mode):
            raise CaptureRefused(f"capture server {server} named {excerpt(handle, 200)}, which is not a plain file "
                                 "(a symlink is refused); nothing it points to is opened or removed")
        target = taken_dir / f"taken_{os.getpid()}_{next(_taken)}{SUFFIX}"
        try:
            os.rename(name, target, src_dir_fd=folder)
        except OSError as exc:
            if exc.errno != errno.EXDEV:  # the staging folder is on another filesystem
                raise
            _copy_out(name, folder, target)
    finally:
        os.close(folder)
    moved = os.stat(target, follow_symlinks=False)
    if not stat.S_ISREG(moved.st_mode):  # swapped for a link after the check: the link goes, not its target
        target.unlink()
        raise CaptureRefused(f"capture server {server} replaced {excerpt(handle, 200)} by something other than a "
                             "plain file while it was taken")
    return target


def _copy_out(name: str, folder: int, target: Path) -> None:
    source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise CaptureRefused("the hidden-states file is not a plain file")
        with open(source, "rb", closefd=False) as reading, open(target, "xb") as writing:
            shutil.copyfileobj(reading, writing)
    finally:
        os.close(source)
    os.unlink(name, dir_fd=folder)
