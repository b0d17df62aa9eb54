"""The training dataset of an online run: prepared rows joined with hidden states that capture
servers produce when the trainer first needs them, kept in a bounded cache.

The trainer reads rows in the order its plan says (`expect` is told that order before each epoch
and before validation). Each read asks the servers for the next rows ahead of it, as many as the
cache has room for beside the row being read and as the servers can work on at once, so that a
sample is usually in the cache before it is read. A read that finds its row neither cached nor
arrived waits, and that wait is the supply figure the run page shows (`fetch_wait_fraction`). The
read itself is HiddenStateSamples' (the same file checks as an extraction's).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.target import read_target_config
from workers.stages.extract.with_vllm import max_model_len
from workers.stages.train.data import HiddenStateSamples
from workers.stages.train.online.cache import SampleCache
from workers.stages.train.online.capture import CaptureClient
from workers.stages.train.online.servers import CaptureFleet
from workers.stages.train.online.source import OnlineSource, SupplyReport

log = logging.getLogger(__name__)

# In flight per live server: vLLM batches them into one forward (4 left a CPU server half idle).
REQUESTS_PER_SERVER = 16
REQUEST_TIMEOUT_S = 600.0  # a stalled server's request fails after this and goes to another server
SUPPLY_BOUND_WAIT = 0.10  # above this share of step time waiting for data, the run is supply-bound


class OnlineHiddenStateSamples(HiddenStateSamples):
    def __init__(self, *, prepared_dir: Path, cache: SampleCache, layer_ids: list[int], hidden_size: int):
        super().__init__(prepared_dir=prepared_dir, hidden_states_dir=cache.dir, layer_ids=layer_ids,
                         hidden_size=hidden_size)
        self.cache = cache
        self.client: CaptureClient | None = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[int, Future] = {}
        self._ahead_bytes = 0
        self._order: list[int] = []
        self._position: dict[int, int] = {}
        self._next_submit = 0
        self._fetched_now: set[int] = set()
        self.reads = self.hits = 0
        self.wait_seconds = 0.0
        self.hit_rates: list[float] = []  # per epoch of training reads
        self._validation = False
        longest = max(self.lengths, default=0)
        if self.row_bytes(longest) > cache.limit_bytes:
            raise InputError(f"the hidden-states cache ({cache.limit_bytes / 2**30:.3g} GiB) is smaller than the "
                             f"longest row's sample ({self.row_bytes(longest) / 2**30:.3g} GiB for {longest} tokens): "
                             "raise hidden_states_cache_gib")

    def row_bytes(self, tokens: int) -> int:
        return tokens * (self.num_layers * self.hidden_size * 2 + 8) + 4096  # bf16 states, int64 ids, header

    def identity(self) -> list:
        """What the training's resume fingerprint records of its hidden states: the source, not the
        cache's passing contents."""
        return ["online", str(self.cache.dir.resolve())]

    def attach(self, client: CaptureClient, *, servers: int) -> None:
        self.client = client
        self._pool = ThreadPoolExecutor(max_workers=max(1, servers) * REQUESTS_PER_SERVER,
                                        thread_name_prefix="capture")
        self._max_in_flight = max(1, servers) * REQUESTS_PER_SERVER

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def expect(self, rows: list[int], *, validation: bool = False) -> None:
        """The rows the trainer reads next, in order (an epoch's plan, or validation's)."""
        with self._lock:
            self._finish_epoch_locked()
            self._validation = validation
            self._order = list(rows)
            self._position = {row: n for n, row in enumerate(self._order)}
            self._next_submit = 0
            self._fetched_now = set()
        self._top_up(0)

    def _finish_epoch_locked(self) -> None:
        """Close a pass over the rows: an epoch's training reads give its hit rate (validation's do not count)."""
        if self.reads and not self._validation:
            self.hit_rates.append(self.hits / self.reads)
        self.reads = self.hits = 0

    def _top_up(self, position: int) -> None:
        """Ask for rows after `position` while the cache has room and the servers have capacity."""
        budget = self.cache.limit_bytes - self.row_bytes(max(self.lengths, default=0))
        with self._lock:
            self._next_submit = max(self._next_submit, position)
            while self._next_submit < len(self._order) and len(self._futures) < self._max_in_flight:
                row = self._order[self._next_submit]
                if row in self._futures or self.cache.has(row):
                    self._next_submit += 1
                    continue
                need = self.row_bytes(self.lengths[row])
                if self._ahead_bytes + need > budget:
                    break
                self._ahead_bytes += need
                self.cache.pin(row)
                self._futures[row] = self._pool.submit(self._fetch, row)
                self._next_submit += 1

    def _fetch(self, row: int):
        """On a pool thread: room reserved in the cache, then the sample captured into it."""
        self.cache.reserve(row, self.row_bytes(self.lengths[row]))
        try:
            ids = self.rows.with_format(None)[row]["input_ids"]
            return self.client.capture(row, ids)
        except BaseException:
            self.cache.release(row)
            raise

    def _await(self, row: int) -> float:
        """Row's sample in the cache (pinned); seconds spent waiting for it."""
        with self._lock:
            future = self._futures.get(row)
            cached = future is None and self.cache.touch(row)
            if cached:
                self.cache.pin(row)
        if cached:
            if row not in self._fetched_now:
                self.hits += 1
            return 0.0
        started = time.perf_counter()
        if future is None:  # not foreseen (or evicted since): fetched now, the trainer waiting
            with self._lock:
                self.cache.pin(row)
                self._ahead_bytes += self.row_bytes(self.lengths[row])
                future = self._futures[row] = self._pool.submit(self._fetch, row)
        try:
            future.result()
        except BaseException:
            with self._lock:
                self._futures.pop(row, None)
                self._ahead_bytes -= self.row_bytes(self.lengths[row])
                self.cache.unpin(row)
            raise
        waited = time.perf_counter() - started
        with self._lock:
            self._futures.pop(row, None)
            self._ahead_bytes -= self.row_bytes(self.lengths[row])
            self._fetched_now.add(row)
        return waited

    def __getitem__(self, index: int):
        if self.client is None:
            raise RuntimeError("the online samples have no capture client attached")
        with self._lock:
            position = self._position.get(index)
            self.reads += 1
        waited = self._await(index)
        self.wait_seconds += waited
        try:
            item = super().__getitem__(index)
        finally:
            self.cache.unpin(index)
        self._top_up((position or 0) + 1)
        return item

    def step_values(self, seconds: float) -> dict[str, float]:
        """Supply figures the trainer reports with each step's metrics (names charted as their own group)."""
        rate = self.client.tokens / max(self.client.busy_seconds(), 1e-9) if self.client.tokens else 0.0
        return {"supply/fetch_wait_fraction": min(1.0, self.wait_seconds / max(seconds, 1e-9)),
                "supply/capture_tokens_per_s": rate,
                "supply/cache_hit_rate": self.hits / self.reads if self.reads else 0.0}

    def report(self, *, train_seconds: float, train_tokens: int, servers: list,
               startup_seconds: float = 0.0) -> SupplyReport:
        with self._lock:
            self._finish_epoch_locked()
        busy = self.client.busy_seconds()
        capture_rate = self.client.tokens / busy if busy > 0 else None
        wait_fraction = min(1.0, self.wait_seconds / train_seconds) if train_seconds > 0 else 0.0
        report = SupplyReport(
            hidden_states="online", fetch_wait_fraction=wait_fraction, fetch_wait_seconds=self.wait_seconds,
            capture_tokens_per_s=capture_rate, capture_tokens=self.client.tokens, capture_seconds=busy,
            cache_hit_rate_per_epoch=list(self.hit_rates), peak_cache_bytes=self.cache.peak_bytes,
            cache_limit_bytes=self.cache.limit_bytes, evictions=self.cache.evictions,
            served_by={s.url: s.captured for s in servers}, retried=self.client.retried,
            servers_startup_seconds=round(startup_seconds, 2),
            bound="supply" if wait_fraction > SUPPLY_BOUND_WAIT else "compute")
        report.advice = advise(report, train_seconds=train_seconds, train_tokens=train_tokens,
                               servers=max(1, sum(1 for s in servers if s.captured)))
        return report


def advise(report: SupplyReport, *, train_seconds: float, train_tokens: int, servers: int) -> str:
    """What the measured rates imply: how many capture servers keep one trainer fed at this size."""
    compute_seconds = train_seconds - report.fetch_wait_seconds
    if not report.capture_tokens_per_s or compute_seconds <= 0 or not train_tokens:
        return "not enough was measured to size the capture servers"
    demand = train_tokens / compute_seconds  # tokens/s the trainer consumes when it never waits
    per_server = report.capture_tokens_per_s / servers
    needed = max(1, math.ceil(demand / per_server))
    words = (f"{needed} capture server{'s feed' if needed > 1 else ' feeds'} 1 trainer at this size: the trainer "
             f"consumes {demand:,.0f} tokens/s, a server captures {per_server:,.0f} tokens/s")
    if report.bound == "supply" and needed > servers:
        words += (f"; the trainer waited {report.fetch_wait_fraction:.0%} of its step time: add {needed - servers} "
                  f"capture server{'s' if needed - servers > 1 else ''}")
    elif report.bound == "supply":
        words += (f"; the trainer waited {report.fetch_wait_fraction:.0%} of its step time though the servers' rate "
                  "suffices: the wait is their start and each sample's latency, not their throughput (a larger cache "
                  "lets more be asked for ahead)")
    return words


@contextmanager
def online_samples(*, online: OnlineSource, target_dir: Path, prepared_dir: Path, layer_ids: list[int],
                   should_stop: Callable[[], bool] | None = None,
                   request_timeout_s: float = REQUEST_TIMEOUT_S) -> Iterator[tuple[OnlineHiddenStateSamples, CaptureFleet]]:
    """The online dataset with its capture servers started (or reached) and checked; on the way out
    the servers this stage started are stopped and the cache's served.json written."""
    target = read_target_config(target_dir)
    cache = SampleCache(Path(online.cache_dir), limit_bytes=online.cache_bytes)
    samples = OnlineHiddenStateSamples(prepared_dir=prepared_dir, cache=cache, layer_ids=layer_ids,
                                       hidden_size=target.hidden_size)
    fleet = CaptureFleet(target_dir=target_dir, layer_ids=layer_ids, count=online.capture_servers,
                         urls=online.capture_urls, work_dir=Path(online.cache_dir) / "servers",
                         max_model_len=max_model_len(target_dir, samples.lengths),
                         vllm_executable=online.vllm_executable, should_stop=should_stop,
                         allowed_hosts=online.capture_allowed_hosts, url_staging=online.capture_staging_dir)
    with fleet:
        client = CaptureClient(fleet, cache, layer_ids=layer_ids, hidden_size=target.hidden_size,
                               num_hidden_layers=target.num_layers, request_timeout_s=request_timeout_s)
        samples.attach(client, servers=len(fleet.servers))
        log.info("online hidden states: %d capture server(s) ready in %.0f s (%s), cache %s limited to %.3g GiB",
                 len(fleet.servers), fleet.startup_seconds, ", ".join(s.url for s in fleet.servers), cache.dir,
                 cache.limit_bytes / 2**30)
        try:
            yield samples, fleet
        finally:
            samples.close()
            client.close()
            cache.write_served()
