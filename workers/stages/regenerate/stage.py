"""regenerate(): a chat dataset's assistant replies written again by the target ("on-policy" data).

The source is read twice: once to choose the conversations (curation's exclusions, max_samples) and to
refuse a file the target cannot answer before a model or server starts, then again to answer them.
Replies come from one of two backends with the same contract (answer(history, seed) -> Reply): the
target in transformers here, or `vllm serve`, which answers several conversations at once. Rows are
written in source order either way, each on disk before the next (workers/stages/regenerate/resume.py),
so a killed attempt loses at most the conversations in flight.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from pathlib import Path

from workers.stages.regenerate.base import (
    BACKENDS,
    ConversationFailed,
    RegenerateError,
    RegenerateResult,
    RegenerateSettings,
    RegenerateStopped,
    Tally,
)
from workers.stages.regenerate.resume import JsonlAppender, OutputFiles
from workers.stages.regenerate.rows import Exclusions, answer_conversation, check_answerable, file_sha256, iter_rows, scan_source
from workers.stages.regenerate.target import regenerate_check_target, target_dtype, target_max_model_len

log = logging.getLogger(__name__)

WAIT_POLL_S = 0.5  # how often should_stop() is asked while a conversation is being answered
WINDOW_PER_SLOT = 4  # conversations queued ahead per slot, so one slow conversation does not idle the rest


def regenerate(
    *,
    target_dir: Path,
    source_path: Path,
    out_path: Path,
    backend: str,
    settings: RegenerateSettings = RegenerateSettings(),
    excluded_ids: frozenset[str] = frozenset(),
    exclude_ids: frozenset[str] = frozenset(),
    exclude_hashes: frozenset[str] = frozenset(),
    exclude_own_ids: frozenset[str] = frozenset(),
    vllm_executable: str | None = None,
    tensor_parallel_size: int = 1,
    work_dir: Path | None = None,
    device: str = "auto",
    vllm_server_url: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    rows: range | None = None,
) -> RegenerateResult:
    """Write `out_path`: the source's conversations (same format, same other keys, "id" always set)
    with every user turn answered by the target, and a "regenerated" key counting the replies.

    Exclusions: `excluded_ids` / `exclude_ids` by source id (the row's "id", or its 0-based line index),
    `exclude_hashes` and `exclude_own_ids` as the prepare stage reads curation's. `work_dir`: where
    vLLM's log goes (beside out_path when not given). `device`: the transformers backend's ("auto":
    CUDA when there is one). `vllm_server_url`: answer with a vLLM server already running there
    instead of starting one. Calling again with the same out_path resumes what an earlier attempt wrote.

    `rows`: one shard's part (issue 36): the chosen conversations numbered 0.. in file order (what
    regenerate_count_rows counts), of which only these are answered, into `out_path` inside the shard's
    folder (workers.stages.shards.shard_dir); regenerate_merge puts the parts together. The choice
    (exclusions, max_samples, repeated ids) is made over the whole file, so a shard answers exactly the
    conversations one worker would have, and each reply's seed depends on its row alone (turn_seed).
    """
    target_dir, source_path, out_path = Path(target_dir), Path(source_path), Path(out_path)
    if backend not in BACKENDS:
        raise RegenerateError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    settings.check()
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise RegenerateError(f"tensor_parallel_size must be a whole number of at least 1, got {tensor_parallel_size!r}")
    regenerate_check_target(target_dir)
    if not source_path.is_file():
        raise RegenerateError(f"{source_path}: the dataset file is not there")
    exclusions = Exclusions(ids=frozenset(excluded_ids) | frozenset(exclude_ids), hashes=frozenset(exclude_hashes),
                            own_ids=frozenset(exclude_own_ids))
    scan = scan_source(source_path, exclusions=exclusions, max_samples=settings.max_samples)
    check_answerable(scan, source_path)
    if rows is not None:
        scan.ids = _shard_of(scan.ids, rows)
    source_sha256 = file_sha256(source_path)
    dtype, max_model_len = target_dtype(target_dir), target_max_model_len(target_dir, settings.max_model_len)

    files = OutputFiles(out_path)
    files.begin({"source_sha256": source_sha256, "target": str(target_dir.resolve()), "backend": backend,
                 **settings.identity()})
    tally = files.load(chosen=set(scan.ids.values()))
    resumed_from = tally.conversations
    todo = {line for line, sid in scan.ids.items() if not files.done(sid, line, repeated=line in scan.duplicates)}
    total = len(scan.ids)
    if tally.conversations or tally.failures:
        log.info("resuming %s: %d conversations written and %d failed by earlier attempts, %d to do", out_path,
                 tally.conversations, tally.failures, len(todo))
    version, seconds = "", 0.0
    rows_file, failures_file = files.open()
    writer = _Writer(rows_file, failures_file, tally, done=total - len(todo), total=total, on_progress=on_progress)
    stop = _stop_check(should_stop, writer)
    try:
        writer.progress()
        if todo:
            with _replier(backend, target_dir=target_dir, dtype=dtype, max_model_len=max_model_len, settings=settings,
                          tensor_parallel_size=tensor_parallel_size, device=device, vllm_executable=vllm_executable,
                          vllm_server_url=vllm_server_url, log_dir=Path(work_dir) if work_dir else out_path.parent,
                          should_stop=should_stop) as replier:
                version = replier.version
                started = time.perf_counter()
                todo_rows = _todo_rows(source_path, todo, scan.duplicates)
                _answer_all(todo_rows, replier, seed=settings.seed, writer=writer, stop=stop)
                seconds = time.perf_counter() - started
        else:
            version = _backend_version(backend, vllm_executable)
    finally:
        files.close()
    if not tally.conversations and rows is None:  # a shard may fail all its own: the merge judges the whole
        raise RegenerateError(f"{source_path}: none of the {total} conversations could be answered, e.g. "
                              f"{tally.failure_examples[:3]}; see {files.failures}")
    files.finish()
    result = RegenerateResult(
        out_path=str(out_path), source_sha256=source_sha256, backend=backend, backend_version=version,
        conversations=tally.conversations, turns_regenerated=tally.turns, replies_cut=tally.cut,
        failures=tally.failures, failure_examples=tally.failure_examples, skipped_excluded=scan.skipped_excluded,
        resumed_from=resumed_from, generated_tokens=tally.tokens, seconds=seconds,
        tokens_per_s=writer.new_tokens / seconds if seconds and writer.new_tokens else 0.0,
        failures_path=str(files.failures), max_model_len=max_model_len)
    log.info("regenerated %s with %s %s: %d conversations (%d resumed), %d replies (%d cut at max_new_tokens), "
             "%d failed, %d excluded; %d tokens this attempt in %.1f s (%.0f tok/s)", source_path, backend, version,
             result.conversations, result.resumed_from, result.turns_regenerated, result.replies_cut, result.failures,
             result.skipped_excluded, writer.new_tokens, seconds, result.tokens_per_s)
    return result


def regenerate_count_rows(*, source_path: Path, settings: RegenerateSettings = RegenerateSettings(),
                          exclude_ids: frozenset[str] = frozenset(), exclude_hashes: frozenset[str] = frozenset(),
                          exclude_own_ids: frozenset[str] = frozenset()) -> int:
    """The conversations a regeneration answers (or fails), which its shards' `rows` number: the source's
    rows less curation's exclusions, up to max_samples. Reads the file once, without a model; a bad line
    or a file with nothing to answer is refused here, before any shard is sent."""
    settings.check()
    source_path = Path(source_path)
    if not source_path.is_file():
        raise RegenerateError(f"{source_path}: the dataset file is not there")
    exclusions = Exclusions(ids=frozenset(exclude_ids), hashes=frozenset(exclude_hashes),
                            own_ids=frozenset(exclude_own_ids))
    scan = scan_source(source_path, exclusions=exclusions, max_samples=settings.max_samples)
    check_answerable(scan, source_path)
    return len(scan.ids)


def _shard_of(ids: dict[int, str], rows: range) -> dict[int, str]:
    """The chosen conversations (line -> id, file order) that shard `rows` answers."""
    if rows.step != 1 or rows.start < 0 or rows.stop > len(ids) or rows.start >= rows.stop:
        raise RegenerateError(f"rows {rows.start}..{rows.stop} is not a span of the {len(ids)} conversations "
                              "to regenerate; was the source or its curation changed after the split?")
    lines = list(ids)[rows.start:rows.stop]
    return {line: ids[line] for line in lines}


class _Writer:
    """Writes each finished conversation (or its failure) and reports progress; main thread only."""

    def __init__(self, rows: JsonlAppender, failures: JsonlAppender, tally: Tally, *, done: int, total: int,
                 on_progress: Callable[[int, int], None] | None):
        self.rows, self.failures, self.tally = rows, failures, tally
        self.done, self.total, self.on_progress = done, total, on_progress
        self.new_tokens = 0

    def progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)

    def write(self, conv, outcome: dict | ConversationFailed) -> None:
        if isinstance(outcome, ConversationFailed):
            entry = {"id": conv.source_id, "line": conv.line, "error": str(outcome)}
            self.failures.write(entry)
            self.tally.add_failure(entry)
            log.warning("conversation %s (line %d) not regenerated: %s", conv.source_id, conv.line, outcome)
        else:
            self.rows.write(outcome)
            self.tally.add_written(outcome["regenerated"])
            self.new_tokens += outcome["regenerated"]["tokens"]
        self.done += 1
        self.progress()


def _stop_check(should_stop: Callable[[], bool] | None, writer: _Writer) -> Callable[[], None]:
    def check() -> None:
        if should_stop is not None and should_stop():
            raise RegenerateStopped(f"regeneration stopped on request with {writer.done} of {writer.total} "
                                    "conversations done; a retry resumes from there")
    return check


def _todo_rows(source_path: Path, todo: set[int], duplicates: dict[int, int]) -> Iterator[tuple]:
    """(conversation, row, the earlier line with its id or None) of the rows to answer, in file order."""
    for conv, row in iter_rows(source_path):
        if conv.line in todo:
            yield conv, row, duplicates.get(conv.line)


def _attempt(conv, row: dict, repeats: int | None, replier, seed: int,
             check: Callable[[], None]) -> dict | ConversationFailed:
    if repeats is not None:  # two output rows with one id would make its lineage ambiguous
        return ConversationFailed(f"its id {conv.source_id!r} is line {repeats}'s too; give each row its own id")
    try:
        return answer_conversation(conv, row, answer=replier.answer, seed=seed, check=check)
    except ConversationFailed as failed:
        return failed


def _answer_all(rows: Iterator, replier, *, seed: int, writer: _Writer, stop: Callable[[], None]) -> None:
    """Answer every row and write them in source order, `replier.concurrency` conversations at a time."""
    if replier.concurrency == 1:
        for conv, row, repeats in rows:
            stop()
            writer.write(conv, _attempt(conv, row, repeats, replier, seed, stop))
        return
    abandon = threading.Event()  # set on leaving: threads still answering give up before their next turn

    def check() -> None:  # should_stop may touch a database connection: only the main thread asks it
        if abandon.is_set():
            raise RegenerateStopped("abandoned")

    def finish(conv, future) -> None:
        while True:
            try:
                outcome = future.result(timeout=WAIT_POLL_S)
                break
            except FutureTimeout:
                stop()
        writer.write(conv, outcome)

    pool = ThreadPoolExecutor(max_workers=replier.concurrency, thread_name_prefix="regenerate")
    window: deque = deque()
    try:
        for conv, row, repeats in rows:
            while len(window) >= replier.concurrency * WINDOW_PER_SLOT:
                finish(*window.popleft())
            stop()
            window.append((conv, pool.submit(_attempt, conv, row, repeats, replier, seed, check)))
        while window:
            finish(*window.popleft())
    finally:
        abandon.set()
        pool.shutdown(wait=False, cancel_futures=True)


@contextmanager
def _replier(backend: str, *, target_dir: Path, dtype: str, max_model_len: int, settings: RegenerateSettings,
             tensor_parallel_size: int, device: str, vllm_executable: str | None, vllm_server_url: str | None,
             log_dir: Path, should_stop: Callable[[], bool] | None):
    if backend == "vllm":
        from workers.stages.regenerate.with_vllm import vllm_replier

        with vllm_replier(target_dir=target_dir, vllm_executable=vllm_executable, dtype=dtype,
                          max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                          max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=settings.seed,
                          log_dir=log_dir, server_url=vllm_server_url, should_stop=should_stop) as replier:
            yield replier
        return
    from workers.stages.regenerate.with_transformers import TransformersReplier

    replier = TransformersReplier(target_dir=target_dir, dtype=dtype, device=device,
                                  tensor_parallel_size=tensor_parallel_size, max_new_tokens=settings.max_new_tokens,
                                  temperature=settings.temperature, max_model_len=max_model_len)
    try:
        yield replier
    finally:
        replier.close()


def _backend_version(backend: str, vllm_executable: str | None) -> str:
    """The backend's version without loading a model or starting a server (nothing was left to do)."""
    if backend == "transformers":
        from importlib.metadata import version

        return version("transformers")
    from workers.contract.host.vllm_env import find_vllm_executable, vllm_install_at

    executable = vllm_executable or find_vllm_executable()
    install = vllm_install_at(executable) if executable else None
    return install.version if install is not None and not isinstance(install, str) else ""
