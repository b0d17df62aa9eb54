"""Replies from `vllm serve` (the target alone, no draft), asked over its OpenAI chat API.

The server is started as the serve check starts one (workers/stages/evaluate/serve_check.py): vLLM's
environment from workers.contract.host.vllm_env (on the CPU build its KV cache size), the target's dtype
named explicitly (like for like with the transformers backend), its own process group, a log whose
tail every error quotes. Each reply is one POST /v1/chat/completions with the history so far, the
reply's seed, max_tokens and temperature; vLLM renders the chat template itself. A 400 (a prompt longer
than max_model_len, a template that refuses the turns) fails that conversation only; anything else (a
refused connection, a 5xx, a server that exited) means vLLM is gone and the regeneration stops.
"""
from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from workers.contract.target import read_target_json
from workers.contract.host.vllm_env import find_vllm_executable, kvcache_gib, server_environment, vllm_install_at
from workers.stages.extract.vllm_server import HOST, VllmServer, VllmServerError, free_port, log_tail
from workers.stages.regenerate.base import ConversationFailed, RegenerateError, RegenerateStopped, Reply

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 8  # conversations in flight; the turns of one are sequential
DEFAULT_STARTUP_TIMEOUT_S = 1800.0  # a large target loads and captures its CUDA graphs in minutes
DEFAULT_REQUEST_TIMEOUT_S = 600.0
LOG_NAME = "vllm_regenerate.log"
CONVERSATION_ERRORS = (400, 422)  # vLLM's answer to one request it cannot serve; other statuses mean the server


def regenerate_serve_command(*, vllm_executable: str, target_dir: Path, dtype: str, max_model_len: int,
                             tensor_parallel_size: int, port: int, seed: int) -> list[str]:
    """`vllm serve TARGET` with the settings both backends share (dtype, context length) and this host's."""
    return [vllm_executable, "serve", str(target_dir), "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--tensor-parallel-size", str(tensor_parallel_size), "--host", HOST, "--port", str(port),
            "--seed", str(seed)]


def _get_json(url: str, timeout: float = 30.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _error_message(body: bytes) -> str:
    """vLLM's error text from its JSON error body ({"error": {"message"}} or {"message"}), else the body."""
    try:
        data = json.loads(body)
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        message = inner.get("message")
        if isinstance(message, str) and message:
            return message[:1000]
    except (ValueError, AttributeError):
        pass
    return body.decode("utf-8", errors="replace")[:1000]


class VllmReplier:
    def __init__(self, *, base_url: str, model: str, version: str, max_new_tokens: int, temperature: float,
                 concurrency: int, request_timeout_s: float, server: VllmServer | None):
        self.base_url, self.model, self.version, self.server = base_url, model, version, server
        self.max_new_tokens, self.temperature = max_new_tokens, float(temperature)
        self.concurrency, self.request_timeout_s = concurrency, request_timeout_s

    def _gone(self, what: str) -> RegenerateError:
        if self.server is None:
            return RegenerateError(f"vLLM at {self.base_url} stopped answering: {what}")
        why = self.server.died(grace_s=2.0)  # a request cut off by a dying server fails before the process exits
        if why is not None:
            return RegenerateError(f"vllm serve died mid-way ({what}): {why}")
        return RegenerateError(f"vLLM failed ({what}); last lines of {self.server.log_path}:\n"
                               f"{log_tail(self.server.log_path)}")

    def answer(self, history: list[dict], seed: int) -> Reply:
        body = {"model": self.model, "messages": history, "max_tokens": self.max_new_tokens,
                "temperature": self.temperature, "seed": seed}
        request = urllib.request.Request(f"{self.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            message = _error_message(exc.read())
            if exc.code in CONVERSATION_ERRORS:
                raise ConversationFailed(f"vLLM refused it (HTTP {exc.code}): {message}") from None
            raise self._gone(f"HTTP {exc.code}: {message}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            raise self._gone(f"{type(exc).__name__}: {exc}") from None
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            tokens = int(data["usage"]["completion_tokens"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise self._gone(f"an answer without choices or usage ({exc!r}): {str(data)[:300]}") from None
        return Reply(text=text, tokens=tokens, cut=choice.get("finish_reason") == "length")


@contextmanager
def vllm_replier(*, target_dir: Path, vllm_executable: str | None, dtype: str, max_model_len: int,
                 tensor_parallel_size: int, max_new_tokens: int, temperature: float, seed: int, log_dir: Path,
                 server_url: str | None = None, concurrency: int = DEFAULT_CONCURRENCY,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[VllmReplier]:
    """A replier over a `vllm serve` of the target started here (and stopped on leaving, whatever
    happened), or over the server already at `server_url`."""
    options = {"max_new_tokens": max_new_tokens, "temperature": temperature, "concurrency": concurrency,
               "request_timeout_s": request_timeout_s}
    if server_url:
        base = server_url.rstrip("/")
        try:
            served, version = _get_json(f"{base}/v1/models")["data"][0]["id"], _get_json(f"{base}/version")["version"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
            raise RegenerateError(f"no vLLM answers at {base}: {exc}") from None
        yield VllmReplier(base_url=base, model=served, version=str(version), server=None, **options)
        return
    executable = vllm_executable or find_vllm_executable()
    install = vllm_install_at(executable) if executable else "vllm is not installed (`make vllm`, or set EAGLE3WEB_VLLM)"
    if isinstance(install, str):
        raise RegenerateError(f"cannot regenerate with vLLM on this worker: {install}; or use the transformers backend")
    raw = read_target_json(target_dir)
    config = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    env = server_environment(install, kvcache_space_gib=kvcache_gib(target_config=config, max_model_len=max_model_len,
                                                                    concurrency=concurrency))
    port = free_port()
    command = regenerate_serve_command(vllm_executable=install.executable, target_dir=target_dir, dtype=dtype,
                                       max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                                       port=port, seed=seed)
    log_dir.mkdir(parents=True, exist_ok=True)
    log.info("starting %s", " ".join(command))
    with VllmServer(command=command, log_path=log_dir / LOG_NAME, port=port, env=env) as server:
        try:
            seconds = server.wait_healthy(timeout_s=startup_timeout_s, should_stop=should_stop, on_stop=lambda: (
                RegenerateStopped("regeneration stopped on request while vLLM was starting")))
        except VllmServerError as exc:
            raise RegenerateError(str(exc)) from None
        log.info("vLLM %s served %s after %.0f s", install.version, target_dir, seconds)
        yield VllmReplier(base_url=server.base_url, model=str(target_dir), version=install.version, server=server,
                          **options)
