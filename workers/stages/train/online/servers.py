"""Capture servers: `vllm serve` with the extract_hidden_states speculative config, started by the
train stage (as the extract stage starts one) or already running at a URL.

A started server writes into its own folder under the run's cache folder (same filesystem: a
checked sample moves into the cache without a copy) and runs under child_guard like every child of
a worker. A server given by URL is a stranger: its URL must pass the capture host rule
(workers.contract.inputs.host_rule, EAGLE3WEB_CAPTURE_ALLOWED_HOSTS, checked again here at use time), every
request goes to the address checked then (no second resolution, no redirect), and the files it names
are taken only from the capture staging folder this worker creates (EAGLE3WEB_CAPTURE_STAGING_DIR, where
its operator points its connector's shared_storage_path: a filesystem both share, as speculators' own
`--vllm-endpoint` training requires; workers.stages.train.online.staging). Every server is checked
before use: /health answers, and /v1/models serves the target (by path, or by folder name for a server
on another host). What a server answers is quoted in errors only as a bounded, escaped excerpt.
"""
from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workers.contract.errors import InputError, StopRequested
from workers.contract.inputs.host_rule import Destination, HostRefused, check_url as check_host, excerpt, loopback, \
    pinned_request
from workers.contract.target import read_target_config
from workers.contract.host.vllm_env import hidden_states_connector
from workers.stages.extract.vllm_server import VllmServer, VllmServerError, free_port, log_tail, serve_command
from workers.stages.extract.with_vllm import STORE_DTYPE, install_and_environment

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 1800.0
PROBE_TIMEOUT_S = 10.0
ANSWER_BYTES = 1 << 20  # the most of /health's or /v1/models' answer read
ALLOWED_SETTING = "EAGLE3WEB_CAPTURE_ALLOWED_HOSTS"
# On a GPU host the trainer holds its own device: a capture server takes another visible GPU when there
# is one (server n: GPU n + 1, round robin past the first), else shares the trainer's, taking this share of
# its memory (vLLM's default, 0.9, would leave the trainer nothing).
GPU_MEMORY_ENV = "EAGLE3WEB_CAPTURE_GPU_MEMORY_UTILIZATION"
SHARED_GPU_MEMORY = 0.35
CONCURRENCY = 16  # requests a started server's KV cache is sized for: the online dataset's REQUESTS_PER_SERVER


class CaptureStopped(StopRequested):
    """should_stop() asked the training to end while its capture servers started."""


@dataclass
class CaptureServer:
    """One server the training asks for samples: its base URL, the address its requests go to, the
    model id it serves, the staging folder its files must be in, and (for a server this stage started)
    its process."""

    url: str
    destination: Destination
    staging: Path
    model_id: str = ""
    process: VllmServer | None = None
    failures: int = 0
    dead: str | None = None  # why it is no longer asked, once it is not
    captured: int = 0
    in_flight: int = 0
    log_path: Path | None = None
    extra: dict = field(default_factory=dict)

    def why_dead(self) -> str | None:
        if self.dead is None and self.process is not None:
            self.dead = self.process.died()
        return self.dead

    def describe_log(self) -> str:
        if self.log_path is None:
            return f"(the server at {self.url} is not this worker's: read its own log)"
        return f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"


def request(server: CaptureServer, method: str, path: str, *, body: dict | None = None, timeout: float,
            limit: int = ANSWER_BYTES) -> tuple[int, bytes]:
    """(status, body) of one request to `server`'s checked address; an answer over `limit` bytes is refused."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    status, answer, whole = pinned_request(server.destination, method, path, body=data, headers=headers,
                                           timeout=timeout, limit=limit)
    if not whole:
        raise VllmServerError(f"capture server {server.url} answered {method} {path} with more than {limit} bytes")
    return status, answer


def _get_json(server: CaptureServer, path: str):
    status, answer = request(server, "GET", path, timeout=PROBE_TIMEOUT_S)
    if status != 200:
        raise VllmServerError(f"HTTP {status}: {excerpt(answer.decode('utf-8', 'replace'))}")
    return json.loads(answer.decode())


def check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError(f"capture server URL {excerpt(url, 100)} is not an http(s)://host:port address")
    return url.rstrip("/").removesuffix("/v1")


def served_model(server: CaptureServer, target_dir: Path) -> str:
    """The model id under which `server` serves the target, refused when it serves another model."""
    try:
        models = _get_json(server, "/v1/models").get("data", [])
        names = [(m.get("id"), m.get("root")) for m in models]
    except (VllmServerError, OSError, ValueError, AttributeError) as exc:
        raise VllmServerError(f"capture server {server.url}: GET /v1/models failed ({excerpt(exc, 300)}); "
                              f"{server.describe_log()}") from None
    target = Path(target_dir)
    for model_id, root in names:
        for name in (model_id, root):
            if not isinstance(name, str) or not name:
                continue
            if name == str(target) or Path(name).name == target.name:
                return str(model_id)
    raise InputError(f"capture server {server.url} serves {excerpt([r or i for i, r in names], 200)}, not the run's "
                     f"target {target}: point the run at a server started for its target")


class CaptureFleet:
    """The servers of one training. Leaving the context stops the ones it started."""

    def __init__(self, *, target_dir: Path, layer_ids: list[int], count: int, urls: tuple[str, ...] | list[str],
                 work_dir: Path, max_model_len: int, vllm_executable: str = "vllm",
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, should_stop: Callable[[], bool] | None = None,
                 allowed_hosts: Sequence[str] = (), url_staging: Path | None = None):
        if count < 0 or (count == 0 and not urls):
            raise InputError("an online run needs at least one capture server: start one (capture_servers >= 1) "
                             "or name running ones (capture_urls)")
        self.target_dir, self.layer_ids = Path(target_dir), list(layer_ids)
        self.count, self.urls = count, [check_url(u) for u in urls]
        self.work_dir, self.max_model_len = Path(work_dir), max_model_len
        self.vllm_executable, self.startup_timeout_s = vllm_executable, startup_timeout_s
        self.should_stop = should_stop
        self.allowed_hosts, self.url_staging = list(allowed_hosts), url_staging
        self.servers: list[CaptureServer] = []
        self.startup_seconds = 0.0

    def __enter__(self) -> CaptureFleet:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for server in self.servers:
            if server.process is not None:
                server.process.stop()

    def _start(self) -> None:
        started = time.perf_counter()
        sample_bytes_per_token = len(self.layer_ids) * read_target_config(self.target_dir).hidden_size * 2
        for n in range(self.count):
            staging = self.work_dir / f"capture_{n}"
            staging.mkdir(parents=True, exist_ok=True)
            port = free_port()
            install, env = install_and_environment(
                self.vllm_executable, target_dir=self.target_dir, max_model_len=self.max_model_len,
                concurrency=CONCURRENCY, cached_bytes_per_token=sample_bytes_per_token)
            command = serve_command(vllm_executable=self.vllm_executable, target_dir=self.target_dir,
                                    layer_ids=self.layer_ids, staging_dir=staging.resolve(), tensor_parallel_size=1,
                                    port=port, max_model_len=self.max_model_len, dtype=STORE_DTYPE,
                                    connector=hidden_states_connector(install))
            if install is not None and not install.is_cpu:
                command, env = on_gpu(command, env or {}, n=n, visible=_visible_gpus())
            log_path = self.work_dir / f"capture_{n}.log"
            process = VllmServer(command=command, log_path=log_path, port=port, env=env)
            log.info("starting capture server %d: %s", n, " ".join(command))
            process.start()
            self.servers.append(CaptureServer(url=process.base_url, destination=loopback(port), process=process,
                                              staging=staging.resolve(), log_path=log_path))
        for url in self.urls:
            self.servers.append(self._reached(url))

        def stopped() -> Exception:
            return CaptureStopped("training stopped on request while its capture servers started")

        for server in self.servers:
            if server.process is not None:  # all started at once above; each waited for in turn
                remaining = max(1.0, self.startup_timeout_s - (time.perf_counter() - started))
                server.process.wait_healthy(timeout_s=remaining, should_stop=self.should_stop, on_stop=stopped)
            elif not _healthy(server):
                raise VllmServerError(f"capture server {server.url} does not answer GET /health: is it running?")
            server.model_id = served_model(server, self.target_dir)
        self.startup_seconds = time.perf_counter() - started

    def _reached(self, url: str) -> CaptureServer:
        """A server given by URL, its address checked against the capture host rule now (the setting may have
        changed since launch, and the name may resolve otherwise), its files confined to the staging folder."""
        try:
            destination = check_host(url, allowed=self.allowed_hosts, setting=ALLOWED_SETTING, what="capture server")
        except HostRefused as exc:
            raise InputError(f"capture_urls: {exc}") from None
        if self.url_staging is None:
            raise InputError(f"capture server {url}: no capture staging folder to read its files from "
                             "(EAGLE3WEB_CAPTURE_STAGING_DIR)")
        staging = Path(self.url_staging)
        staging.mkdir(parents=True, exist_ok=True)
        return CaptureServer(url=url, destination=destination, staging=staging.resolve())

    def live(self) -> list[CaptureServer]:
        return [s for s in self.servers if s.why_dead() is None]


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()  # NVML's count: no CUDA context is made in this process


def on_gpu(command: list[str], env: dict[str, str], *, n: int, visible: int) -> tuple[list[str], dict[str, str]]:
    """Capture server n's device on a CUDA host: the GPU after the trainer's (round robin over the visible
    ones after the first; named as this worker's own CUDA_VISIBLE_DEVICES names them) when there are several,
    else the trainer's own, with SHARED_GPU_MEMORY of it (or the setting)."""
    if visible > 1:
        names = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or \
            [str(i) for i in range(visible)]
        return command, {**env, "CUDA_VISIBLE_DEVICES": names[1 + n % (visible - 1)].strip()}
    share = os.environ.get(GPU_MEMORY_ENV) or str(SHARED_GPU_MEMORY)
    return command + ["--gpu-memory-utilization", share], env


def _healthy(server: CaptureServer) -> bool:
    try:
        return request(server, "GET", "/health", timeout=PROBE_TIMEOUT_S)[0] == 200
    except (VllmServerError, OSError):
        return False
