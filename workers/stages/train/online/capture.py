"""One sample's hidden states from a capture server: asked where fewest requests wait, checked,
moved into the cache; retried on another server when one dies or stalls.

The request is speculators' own (`vllm_client.generate_hidden_states`: the row's token ids as the
prompt, max_tokens=1), the file check is the extract stage's (workers.stages.extract.with_vllm.check_sample:
keys, int64 token ids equal to the row, bf16 [T, L, H], finite), and the file's header stamp
(workers/vllm_plugins: layer ids, model widths) must match the run: a server started for other
layers or another target is refused with the sample named, and nothing of it is cached. A refusal
is about the data, so it is never retried; a sample the cache has no room for (CacheFullError) is
about the run's cache setting, so it is not retried either and the server stays in use; a failed or
timed-out request is about the server, so it is (on another server while one is left).

A server's answer is untrusted: the request goes to the address its URL was checked at
(servers.request), the path it names is taken only from its staging folder (staging.take_sample:
no symlink, nothing outside opened or removed), and what it says reaches an error only as a
bounded, escaped excerpt.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workers.contract.inputs.host_rule import excerpt
from workers.stages.extract.vllm_server import VllmServerError
from workers.stages.extract.with_vllm import LOCK_TIMEOUT_S, VllmOutputError, check_sample
from workers.stages.train.online.cache import CacheFullError, SampleCache
from workers.stages.train.online.servers import CaptureFleet, CaptureServer, request
from workers.stages.train.online.staging import CaptureRefused, take_sample

log = logging.getLogger(__name__)

STAMP = "eagle3web_"
# The most of a completion's answer read: its prompt_token_ids echo the row (a few bytes a token).
COMPLETION_BYTES = 64 << 20
FAILURES_BEFORE_DEAD = 2  # consecutive failed requests after which a server that still runs is left alone


@dataclass(frozen=True)
class Captured:
    row: int
    tokens: int
    server: str
    seconds: float


def check_stamp(path: Path, *, row: int, server: str, layer_ids: list[int], hidden_size: int,
                num_hidden_layers: int) -> None:
    """Refuse a file whose header says it was captured with other layer ids or another model width."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if f"{STAMP}layer_ids" not in meta:
        raise CaptureRefused(
            f"sample {row}: capture server {server} wrote hidden states without eagle3web's stamp, so the layers "
            "it captured cannot be checked: start it with eagle3web's connector (kv_connector "
            "StampedHiddenStatesConnector, kv_connector_module_path eagle3web_cpu_connector, workers/vllm_plugins "
            "on PYTHONPATH)")
    try:
        served_layers = json.loads(meta[f"{STAMP}layer_ids"])
    except ValueError:
        served_layers = meta[f"{STAMP}layer_ids"]
    if served_layers != list(layer_ids):
        raise CaptureRefused(f"sample {row}: capture server {server} captures layers {served_layers}, "
                             f"the run trains on layers {list(layer_ids)}: start it with the run's layer ids")
    widths = (meta.get(f"{STAMP}hidden_size"), meta.get(f"{STAMP}num_hidden_layers"))
    if widths != (str(hidden_size), str(num_hidden_layers)):
        raise CaptureRefused(
            f"sample {row}: capture server {server} serves {meta.get(f'{STAMP}model')} (hidden size {widths[0]}, "
            f"{widths[1]} layers), not the run's target (hidden size {hidden_size}, {num_hidden_layers} layers)")


class CaptureClient:
    """Asks the fleet's servers for samples; thread-safe (the prefetcher calls it from a pool)."""

    def __init__(self, fleet: CaptureFleet, cache: SampleCache, *, layer_ids: list[int], hidden_size: int,
                 num_hidden_layers: int, request_timeout_s: float):
        self.fleet, self.cache = fleet, cache
        self.layer_ids, self.hidden_size, self.num_hidden_layers = list(layer_ids), hidden_size, num_hidden_layers
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self.taken_dir = Path(fleet.work_dir) / "taken"  # the run's own: no server writes here
        self.retried = 0
        self.tokens = 0
        self._busy_since: float | None = None
        self._busy_seconds = 0.0
        self._in_flight = 0

    def close(self) -> None:
        """Nothing held between requests (each opens its own connection to the checked address)."""

    # -- how busy the servers were: tokens per second of time with at least one request in flight
    def _begin(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1

    def _end(self, tokens: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self.tokens += tokens
            if self._in_flight == 0 and self._busy_since is not None:
                self._busy_seconds += time.perf_counter() - self._busy_since
                self._busy_since = None

    def busy_seconds(self) -> float:
        with self._lock:
            open_span = time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0
            return self._busy_seconds + open_span

    def _choose(self, tried: set[str]) -> CaptureServer | None:
        with self._lock:
            live = [s for s in self.fleet.servers if s.why_dead() is None and s.url not in tried]
            if not live:
                return None
            server = min(live, key=lambda s: (s.in_flight, s.captured))
            server.in_flight += 1
            return server

    def capture(self, row: int, token_ids: list[int]) -> Captured:
        """Row's sample in the cache (as hs_{row}.safetensors), from the least busy live server."""
        tried: set[str] = set()
        errors: list[str] = []
        self._begin()
        try:
            while (server := self._choose(tried)) is not None:
                started = time.perf_counter()
                try:
                    self._capture_on(server, row, token_ids)
                except (CaptureRefused, CacheFullError):  # the data's or the run's cache setting's, not the server's
                    raise
                except Exception as exc:  # noqa: BLE001 - a request or file failure: try elsewhere
                    errors.append(f"{server.url}: {str(exc)[:300]}")
                    tried.add(server.url)
                    with self._lock:
                        server.failures += 1
                        if server.failures >= FAILURES_BEFORE_DEAD and server.dead is None:
                            server.dead = f"{server.failures} requests in a row failed, last: {str(exc)[:200]}"
                        self.retried += 1
                    log.warning("sample %d failed on capture server %s (%s); trying another", row, server.url, exc)
                    continue
                finally:
                    with self._lock:
                        server.in_flight -= 1
                with self._lock:
                    server.failures = 0
                    server.captured += 1
                return Captured(row=row, tokens=len(token_ids), server=server.url,
                                seconds=time.perf_counter() - started)
        finally:
            self._end(len(token_ids))
        dead = [f"{s.url}: {s.why_dead()}" for s in self.fleet.servers if s.why_dead() is not None]
        logs = "\n".join(s.describe_log() for s in self.fleet.servers if s.process is not None)
        raise VllmServerError(f"sample {row} ({len(token_ids)} tokens): no capture server could produce it; "
                              f"tried {errors}; servers out of use: {dead}\n{logs}")

    def _capture_on(self, server: CaptureServer, row: int, token_ids: list[int]) -> None:
        written = take_sample(ask_hidden_states(server, token_ids, timeout=self.request_timeout_s),
                              staging=server.staging, taken_dir=self.taken_dir, server=server.url,
                              lock_timeout_s=LOCK_TIMEOUT_S)
        try:
            check_stamp(written, row=row, server=server.url, layer_ids=self.layer_ids,
                        hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers)
            try:
                check_sample(written, index=row, token_ids=token_ids, num_layers=len(self.layer_ids),
                             hidden_size=self.hidden_size)
            except VllmOutputError as exc:
                raise CaptureRefused(f"capture server {server.url}: {exc}") from None
            self.cache.put(row, written, server=server.url, tokens=len(token_ids))
        finally:
            written.unlink(missing_ok=True)  # taken into the run's own folder: only ours is removed


def ask_hidden_states(server: CaptureServer, token_ids: list[int], *, timeout: float) -> object:
    """The path `server` names for the row's hidden states. The request is speculators' (its vllm_client's
    generate_hidden_states: the token ids as the prompt, max_tokens=1, return_token_ids) and so is the check of
    the answer (extract_output: choices[0].prompt_token_ids equal the row; kv_transfer_params' hidden_states_path,
    or handle), but it goes to the address checked for the server, its answer bounded, quoted only in excerpt."""
    body = {"model": server.model_id, "prompt": token_ids, "max_tokens": 1, "return_token_ids": True}
    try:
        status, answer = request(server, "POST", "/v1/completions", body=body, timeout=timeout,
                                 limit=COMPLETION_BYTES)
    except (OSError, VllmServerError) as exc:  # refused, reset, timed out, or too long an answer
        why = server.why_dead()
        raise VllmServerError(f"request failed: {type(exc).__name__}: {excerpt(exc, 300)}"
                              + (f" (the server died: {why[:300]})" if why else "")) from None
    if status != 200:
        raise VllmServerError(f"request failed: HTTP {status}: {excerpt(answer.decode('utf-8', 'replace'), 300)}")
    try:
        completion = json.loads(answer)
        echoed = completion["choices"][0].get("prompt_token_ids")
        transfer = completion.get("kv_transfer_params") or {}
        handle = transfer.get("hidden_states_path") or transfer.get("handle")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise VllmServerError(f"request failed: not a completion: {excerpt(answer.decode('utf-8', 'replace'), 200)}") \
            from None
    if echoed != token_ids:
        raise VllmServerError(f"request failed: the server's prompt_token_ids ({excerpt(echoed, 100)}) are not the "
                              f"row's {len(token_ids)} token ids")
    if handle is None:
        raise VllmServerError("request failed: the answer's kv_transfer_params name no hidden_states_path: is the "
                              "server started with the extract_hidden_states connector?")
    return handle
