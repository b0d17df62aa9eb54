"""A `vllm serve` process for hidden-state extraction: its command line, start, health, stop.

Pure (no Django, no torch). The command is the one speculators' `scripts/launch_vllm.py` execs
(see workers.stages.extract.with_vllm for the upstream references), with our own vLLM arguments after
it. The server runs in its own process group (vLLM starts engine-core and tensor-parallel worker
processes), so stopping it signals the whole group: SIGTERM, then SIGKILL after a grace period.
Its stdout and stderr go to a log file whose tail every error quotes.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from workers.stages.children.child_process import die_with_parent, guarded, stop_group

HOST = "127.0.0.1"
HEALTH_POLL_SECONDS = 1.0
# vLLM binds its port before the engine is up, so a connection can be accepted and then left
# unanswered for minutes while weights load: each probe gives up quickly and counts as "not yet".
HEALTH_PROBE_TIMEOUT_SECONDS = 2.0
STOP_GRACE_SECONDS = 30.0
LOG_TAIL_LINES = 40
LOG_TAIL_CHARS = 4000


class VllmServerError(RuntimeError):
    """vllm serve could not be started, died, or never became healthy; the message quotes its log."""


def free_port() -> int:
    """A port nobody listens on right now. Another process may still take it before vLLM binds
    it; vLLM then exits ('address already in use') and the error quotes that line."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def serve_command(*, vllm_executable: str, target_dir: Path, layer_ids: list[int], staging_dir: Path,
                  tensor_parallel_size: int, port: int, max_model_len: int, dtype: str,
                  connector: dict | None = None) -> list[str]:
    """`vllm serve` configured as speculators' launch_vllm.py configures it.

    launch_vllm.py spells the two configs `--speculative_config` / `--kv_transfer_config`; vLLM's
    FlexibleArgumentParser reads underscores and dashes alike, and we use its documented dashes.
    `connector`: kv_transfer_config's connector keys (workers.contract.host.vllm_env.hidden_states_connector),
    the stock ExampleHiddenStatesConnector when not given."""
    speculative_config = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }
    # hs_connectors.transfer.FileBackend.build_kv_transfer_config: the "file" backend.
    kv_transfer_config = {
        **(connector or {"kv_connector": "ExampleHiddenStatesConnector"}),
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(staging_dir)},
    }
    return [
        vllm_executable, "serve", str(target_dir),
        "--speculative-config", json.dumps(speculative_config),
        "--kv-transfer-config", json.dumps(kv_transfer_config),
        "--tensor-parallel-size", str(tensor_parallel_size),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--host", HOST,
        "--port", str(port),
    ]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16 * chars))
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log was written)"
    tail = "\n".join(text.splitlines()[-lines:])[-chars:]
    return tail or "(the log is empty)"


class VllmServer:
    """One `vllm serve` child. Use as a context manager: leaving it stops the server, whatever
    happened inside (an error, should_stop, a KeyboardInterrupt)."""

    def __init__(self, *, command: list[str], log_path: Path, port: int, env: dict[str, str] | None = None):
        """env: variables added to this process's environment for the server (vLLM's CPU settings)."""
        self.command, self.log_path, self.port = command, Path(log_path), port
        self.env = {**os.environ, **env} if env else None
        self.base_url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen | None = None
        self.stopped = False

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            try:
                # Looked for here: under the guard a missing executable would only be a line in the log.
                if shutil.which(self.command[0], path=(self.env or os.environ).get("PATH")) is None:
                    raise FileNotFoundError(self.command[0])
                self.proc = subprocess.Popen(
                    guarded(self.command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                    start_new_session=True, preexec_fn=die_with_parent())
            except FileNotFoundError:
                raise VllmServerError(
                    f"{self.command[0]!r} was not found: install vLLM on this worker (`make vllm`, or set "
                    "EAGLE3WEB_VLLM to its executable) or run the extraction with the transformers backend") from None

    def died(self, grace_s: float = 0.0) -> str | None:
        """None while the server runs (after waiting up to grace_s for it to exit); else what its
        exit looked like, with its log's tail."""
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout=grace_s) if grace_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return None
        return f"vllm serve exited with code {code}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=HEALTH_PROBE_TIMEOUT_SECONDS) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def wait_healthy(self, *, timeout_s: float, should_stop: Callable[[], bool] | None,
                     on_stop: Callable[[], Exception]) -> float:
        """Seconds until /health answered 200. Raises when the server exits first (with its log's
        tail), when timeout_s passes, or on_stop()'s exception when should_stop() says so."""
        started = time.perf_counter()
        while True:
            if (why := self.died()) is not None:
                raise VllmServerError(f"vllm serve stopped before it was ready: {why}")
            if self._healthy():
                return time.perf_counter() - started
            if should_stop is not None and should_stop():
                raise on_stop()
            waited = time.perf_counter() - started
            if waited > timeout_s:
                raise VllmServerError(
                    f"vllm serve was not healthy within {timeout_s:.0f} s (GET {self.base_url}/health); "
                    "raise the startup timeout for a large target, or read its log. Last lines of "
                    f"{self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(HEALTH_POLL_SECONDS)

    def stop(self, grace_s: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after grace_s."""
        if self.proc is None or self.stopped:
            return
        self.stopped = True  # before signalling: the group id may be reused once it is gone
        stop_group(self.proc, grace_s)
