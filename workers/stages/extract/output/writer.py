"""The extract stage's file writer: one thread, a bounded number of batches in flight, and the first
failure stops it.

An `Executor` (submit / shutdown / `with`), so that the forward loop hands it work the way it would
hand it to any executor, and the synchronous path is the same loop with writes run inline
(workers.stages.extract.output.files._writer chooses). What a ThreadPoolExecutor lacks and the stage needs:
- back-pressure: `submit` blocks while `depth` batches are handed over and not yet written, so a disk
  slower than the forwards stalls the forwards instead of filling the host's memory;
- fail-fast: after a job raises, the jobs queued behind it are cancelled (their files are not
  written) and every later `submit` raises that same exception, so the stage stops at its next
  hand-off with the writer's own message;
- an abort that waits: leaving the `with` block on an exception cancels what is queued and joins the
  thread, so no file is written after the stage has returned (a retry may then resume safely).
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future


class BoundedWriter(Executor):
    """Runs jobs one at a time, in submission order, on a thread of its own."""

    def __init__(self, depth: int, name: str = "extract-writer"):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth = depth
        self._slots = threading.Semaphore(depth)  # one per job handed over and not finished
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Queue `fn(*args, **kwargs)`, first waiting while `depth` jobs are unfinished; raises the
        exception of a job that failed earlier instead of queueing anything more."""
        self._raise_failure()
        self._slots.acquire()
        if self._error is not None or self._stopping.is_set():
            self._slots.release()
            self._raise_failure()
            raise RuntimeError("the writer is shut down; nothing more can be submitted")
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the thread once the queued jobs are done, or cancelled with `cancel_futures`."""
        if cancel_futures:
            self._stopping.set()
        self._jobs.put(None)
        if wait:
            self._thread.join()

    def __exit__(self, exc_type, exc, tb) -> bool:
        # On an exception the stage is stopping: what is still queued is not worth writing.
        self.shutdown(wait=True, cancel_futures=exc_type is not None)
        return False

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, fn, args, kwargs = item
            try:
                # Cancelling runs the future's done-callbacks, which hand back what the job held
                # (a pinned buffer): a forward loop waiting for one then wakes and meets the error.
                if self._error is not None or self._stopping.is_set():
                    future.cancel()
                elif future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:  # noqa: BLE001 - handed to the submitting thread
                        self._error = exc
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                self._slots.release()
