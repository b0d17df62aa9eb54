"""speculators' Trainer trained online: its own `--vllm-endpoint URL/v1 --on-missing generate`
asks a running vLLM capture server for each sample's hidden states instead of reading an extraction.

What speculators 0.9 does with it (train/data.py ArrowDataset._get_raw_data, hs_connectors/transfer.py
FileTransfer): a sample whose `hidden_states/hs_{i}.safetensors` is missing from its --data-path is
asked of the endpoint (`generate_hidden_states`: the row's token ids, max_tokens=1, `--request-timeout`
seconds per request, `--max-retries` retries), read from the path vLLM answers with, checked (token ids
equal the row, finite) and then deleted. The data folder it is given here has an empty `hidden_states/`
(with_speculators/split_data.py), so every sample comes from the server and nothing accumulates: on
disk at any moment are only the samples in flight, in the folder the server writes into.

speculators takes ONE endpoint. The run's first capture server is it (a started one when the run
asks for capture servers, else its first URL); more are not started, and URLs beyond the first are
not asked: the log and the supply figures' advice say so (docs/runs/speculators.md: "speculators' trainer online").

Before torchrun starts, one sample (the shortest row) is asked of the endpoint and checked as our own
online loop checks one (workers.stages.train.online.capture: the file's stamp says the run's layer
ids and the target's widths; keys, dtype, shape, token ids, finite), since speculators checks neither
layers nor target: a server started for other layer ids is refused here, naming it, and nothing trains.

Supply figures, measured from outside speculators' process: samples served and prompt tokens from
the endpoint's own counters on /metrics (`vllm:request_success_total`, `vllm:prompt_tokens_total`,
`vllm:e2e_request_latency_seconds_sum`) read before and after the training; the trainer's wait for
data from the `fetch_ms` / `step_ms` that speculators' step timer logs (rank 0); peak bytes of hidden
states on disk by sampling the server's folder and the given `hidden_states/` while it trains.
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from workers.contract.inputs.host_rule import excerpt
from workers.contract.target import read_target_config
from workers.stages.extract.vllm_server import VllmServerError
from workers.stages.extract.with_vllm import LOCK_TIMEOUT_S, VllmOutputError, check_sample, max_model_len
from workers.stages.train.online.staging import CaptureRefused
from workers.stages.train.online.capture import ask_hidden_states, check_stamp
from workers.stages.train.online.samples import SUPPLY_BOUND_WAIT, advise
from workers.stages.train.online.servers import CaptureFleet, CaptureServer, request
from workers.stages.train.online.staging import take_sample
from workers.stages.train.with_speculators.confine import CONFINE_ENV, confine_spec
from workers.stages.train.online.source import OnlineSource, SupplyReport

log = logging.getLogger(__name__)

# Per request: as long as our own online loop waits for one (a sample of a long row on a busy server
# takes seconds, a stalled server is given up on after this).
REQUEST_TIMEOUT_S = 600.0
MAX_RETRIES = 2  # then speculators' own whole-round-trip retries (--generation-validation-retries, 2)
PROBE_TIMEOUT_S = 600.0
METRICS_TIMEOUT_S = 10.0
_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_COUNTERS = {"vllm:request_success_total": "requests", "vllm:prompt_tokens_total": "prompt_tokens",
             "vllm:e2e_request_latency_seconds_sum": "request_seconds"}


def endpoint_flags(url: str) -> list[str]:
    """speculators' own online option, pointed at the capture server at `url` (http://host:port)."""
    return ["--on-missing", "generate", "--vllm-endpoint", f"{url}/v1", "--request-timeout", repr(REQUEST_TIMEOUT_S),
            "--max-retries", str(MAX_RETRIES)]


@dataclass(frozen=True)
class ServerCounters:
    """vLLM's counters on one server's /metrics page, summed over their labels (engines, finish reasons)."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    request_seconds: float | None = None  # the requests' end-to-end latencies, summed

    def since(self, before: ServerCounters) -> ServerCounters:
        seconds = (None if self.request_seconds is None or before.request_seconds is None
                   else self.request_seconds - before.request_seconds)
        return ServerCounters(requests=self.requests - before.requests,
                              prompt_tokens=self.prompt_tokens - before.prompt_tokens, request_seconds=seconds)


def parse_counters(metrics_text: str) -> ServerCounters:
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE_LINE.match(line.strip())
        if match and match.group(1) in _COUNTERS:
            name = _COUNTERS[match.group(1)]
            totals[name] = totals.get(name, 0.0) + float(match.group(3))
    return ServerCounters(requests=totals.get("requests", 0.0), prompt_tokens=totals.get("prompt_tokens", 0.0),
                          request_seconds=totals.get("request_seconds"))


def read_counters(server: CaptureServer) -> ServerCounters | None:
    """None, said in the log, when the page cannot be read (the supply figures then say so)."""
    try:
        status, answer = request(server, "GET", "/metrics", timeout=METRICS_TIMEOUT_S)
        if status != 200:
            raise VllmServerError(f"HTTP {status}")
        return parse_counters(answer.decode())
    except (VllmServerError, OSError, ValueError) as exc:
        log.warning("capture server %s: GET /metrics failed (%s); its samples served are not counted", server.url,
                    excerpt(exc, 200))
        return None


class DiskPeak:
    """The largest number of bytes of hidden-state files seen at once in some folders."""

    def __init__(self, folders: list[Path]):
        self.folders, self.peak, self.samples = [Path(f) for f in folders], 0, 0

    def sample(self) -> None:
        total = 0
        for folder in self.folders:
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.endswith(".safetensors"):
                    try:
                        total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:  # read and deleted by speculators meanwhile
                        pass
        self.peak, self.samples = max(self.peak, total), self.samples + 1


def probe_endpoint(server: CaptureServer, *, row: int, token_ids: list[int], layer_ids: list[int],
                   hidden_size: int, num_hidden_layers: int, taken_dir: Path) -> Path:
    """Ask `server` for row's sample, check it as the online loop checks one, delete it; the folder
    the server writes into. CaptureRefused names the sample and the server when it disagrees."""
    try:
        handle = ask_hidden_states(server, token_ids, timeout=PROBE_TIMEOUT_S)
    except VllmServerError as exc:
        raise VllmServerError(f"capture server {server.url}: the first sample (row {row}) failed: {exc}; "
                              f"{server.describe_log()}") from None
    try:
        written = take_sample(handle, staging=server.staging, taken_dir=taken_dir, server=server.url,
                              lock_timeout_s=LOCK_TIMEOUT_S)
    except FileNotFoundError:
        raise VllmServerError(f"capture server {server.url} wrote row {row}'s sample to {excerpt(handle, 200)}, which "
                              "this worker cannot read: speculators' trainer needs the server's folder on a shared "
                              "filesystem") from None
    try:
        check_stamp(written, row=row, server=server.url, layer_ids=layer_ids, hidden_size=hidden_size,
                    num_hidden_layers=num_hidden_layers)
        try:
            check_sample(written, index=row, token_ids=token_ids, num_layers=len(layer_ids), hidden_size=hidden_size)
        except VllmOutputError as exc:
            raise CaptureRefused(f"capture server {server.url}: {exc}") from None
    finally:
        written.unlink(missing_ok=True)
    return Path(str(handle)).parent


@dataclass
class SpeculatorsOnline:
    """The endpoint speculators trains from, and what is measured around its training."""

    fleet: CaptureFleet
    endpoint: CaptureServer
    unused: list[str]
    disk: DiskPeak
    before: ServerCounters | None = None

    @property
    def flags(self) -> list[str]:
        """speculators' endpoint flags at the address checked for the server (plain http: the address itself,
        so speculators' process resolves nothing; https keeps the name its certificate is checked against)."""
        where = self.endpoint.destination
        if where.scheme == "http":
            host = f"[{where.address}]" if ":" in where.address else where.address
            return endpoint_flags(f"http://{host}:{where.port}{where.path}".rstrip("/"))
        return endpoint_flags(self.endpoint.url)

    @property
    def env(self) -> dict[str, str]:
        """What keeps speculators' trainer to the server's staging folder (with_speculators.confine)."""
        return {CONFINE_ENV: confine_spec(staging=self.endpoint.staging, taken=self.fleet.work_dir / "taken",
                                          server=self.endpoint.url)}

    def endpoint_state(self) -> str:
        why = self.endpoint.why_dead()
        if why is None:
            return f"its capture server {self.endpoint.url} was still running"
        return f"its capture server {self.endpoint.url} died ({why[:300]}); {self.endpoint.describe_log()}"

    def start_counting(self) -> None:
        self.before = read_counters(self.endpoint)

    def supply(self, *, fetch_seconds: float, step_seconds: float, step_tokens: int) -> dict:
        after = read_counters(self.endpoint)
        served = after.since(self.before) if after is not None and self.before is not None else None
        wait_fraction = min(1.0, fetch_seconds / step_seconds) if step_seconds > 0 else 0.0
        seconds = served.request_seconds if served is not None else None
        report = SupplyReport(
            hidden_states="online", fetch_wait_fraction=wait_fraction, fetch_wait_seconds=fetch_seconds,
            capture_tokens_per_s=served.prompt_tokens / seconds if served is not None and seconds else None,
            capture_tokens=int(served.prompt_tokens) if served is not None else 0, capture_seconds=seconds or 0.0,
            peak_cache_bytes=self.disk.peak,
            served_by={self.endpoint.url: int(served.requests)} if served is not None else {},
            bound="supply" if wait_fraction > SUPPLY_BOUND_WAIT else "compute")
        # The rates as our loop's advice reads them; its remedy when supply-bound (more servers) is not
        # speculators': it asks one endpoint, and fetches ahead only in DataLoader workers.
        said = [advise(dataclasses.replace(report, bound="compute"), train_seconds=step_seconds,
                       train_tokens=step_tokens, servers=1)]
        if report.bound == "supply":
            said.append(f"the trainer waited {wait_fraction:.0%} of its step time for data: another capture server "
                        "cannot help speculators' trainer (one endpoint); with --num-workers N its DataLoader "
                        "workers ask for samples ahead of the step")
        if served is None:
            said.append(f"the capture server's /metrics ({self.endpoint.url}) could not be read: samples served "
                        "and its capture rate are unknown")
        if self.unused:
            said.append(f"speculators' trainer asks one endpoint ({self.endpoint.url}); not used: "
                        + ", ".join(self.unused))
        said.append("not measured from outside speculators' process: its retried requests and dropped samples "
                    "(the log says), a cache hit rate (it has no cache: each sample is asked for, read once and "
                    "deleted); capture tokens/s is per second of vLLM's request latency, summed, so requests "
                    "served at once count their shared seconds twice; the wait for data is rank 0's")
        report.advice = "; ".join(said)
        return report.as_dict()


def endpoint_choice(online: OnlineSource) -> tuple[int, tuple[str, ...], list[str]]:
    """(servers to start, URLs to reach, what is not used): the first of the run's servers only."""
    if online.capture_servers >= 1:
        extra = online.capture_servers - 1
        unused = ([f"{extra} more capture server{'s' if extra > 1 else ''} (not started)"] if extra else [])
        return 1, (), unused + list(online.capture_urls)
    return 0, tuple(online.capture_urls[:1]), list(online.capture_urls[1:])


@contextmanager
def speculators_endpoint(online: OnlineSource, *, target_dir: Path, layer_ids: list[int], prepared_dir: Path,
                         lengths: list[int], hidden_states_folder: Path,
                         should_stop=None) -> Iterator[SpeculatorsOnline]:
    """The capture server speculators trains from, started (or reached) and checked with one sample;
    the server this stage started is stopped on the way out, whatever ended the training."""
    from datasets import load_from_disk

    count, urls, unused = endpoint_choice(online)
    if unused:
        log.warning("speculators' trainer takes one vLLM endpoint: it trains from the run's first capture server; "
                    "not used: %s", ", ".join(unused))
    target = read_target_config(target_dir)
    fleet = CaptureFleet(target_dir=target_dir, layer_ids=layer_ids, count=count, urls=urls,
                         work_dir=Path(online.cache_dir) / "servers", max_model_len=max_model_len(target_dir, lengths),
                         vllm_executable=online.vllm_executable, should_stop=should_stop,
                         allowed_hosts=online.capture_allowed_hosts, url_staging=online.capture_staging_dir)
    with fleet:
        endpoint = fleet.servers[0]
        row = min(range(len(lengths)), key=lambda i: (lengths[i], i))
        started = time.perf_counter()
        token_ids = [int(t) for t in load_from_disk(str(prepared_dir)).with_format(None)[row]["input_ids"]]
        folder = probe_endpoint(endpoint, row=row, token_ids=token_ids,
                                layer_ids=layer_ids, hidden_size=target.hidden_size,
                                num_hidden_layers=target.num_layers, taken_dir=fleet.work_dir / "taken")
        log.info("speculators trains online from %s (ready in %.0f s; row %d's sample checked in %.1f s; it writes "
                 "into %s)", endpoint.url, fleet.startup_seconds, row, time.perf_counter() - started, folder)
        yield SpeculatorsOnline(fleet=fleet, endpoint=endpoint, unused=unused,
                                disk=DiskPeak([folder, Path(hidden_states_folder)]))
