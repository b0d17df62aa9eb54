"""The serve check's load: vLLM's output tokens/s and time per output token at each concurrency (issue 39).

At concurrency c, c client threads each send one request at a time to the server's /v1/completions
(streamed, greedy, the check's prompts in turn, cycled when fewer than the requests), until
max(c, len(prompts)) requests have been answered: every request of a level is in flight beside c − 1
others except at the level's tail. Measured, as vLLM's own `vllm bench serve` measures them:

- output tokens/s: the tokens the replies emitted (each reply's usage.completion_tokens, which vLLM
  counts from the tokens it sent, not from its speculative-decoding counters: those count drafts
  accepted past a reply's end) over the seconds from the first request sent to the last reply ended;
- time per output token: per request, (its seconds − the seconds to its first token) / (its tokens − 1),
  averaged over the requests with more than one token, in milliseconds.

The same levels run on the server with the draft and on the target alone (serve_check), and
speedup_table puts them side by side: speed-up = output tokens/s with the draft / without. Pure: no
Django, no torch; standard library threads (the requests spend their time waiting on the server)."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

MIN_CONCURRENCY, MAX_CONCURRENCY = 1, 256


class LoadError(RuntimeError):
    """A request of the load failed; says which and why."""


@dataclass(frozen=True)
class LoadFigures:
    concurrency: int
    requests: int
    output_tokens: int
    seconds: float
    tokens_per_s: float
    tpot_ms: float | None  # None: no reply had more than one token


def _stream_one(url: str, body: dict, timeout: float) -> tuple[int, float, float | None]:
    """(tokens emitted, seconds, seconds to the first token) of one streamed completion."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first: float | None = None
    tokens = None
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("choices") and first is None:
                first = time.perf_counter() - started
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    if tokens is None:
        raise LoadError("vLLM's stream ended without its usage (completion_tokens)")
    return tokens, time.perf_counter() - started, first


def load_measure(*, base_url: str, model: str, prompts: list[list[int]], max_new_tokens: int, concurrency: int,
                 request_timeout_s: float) -> LoadFigures:
    """One concurrency level against one running server. A stop request is asked between levels (by
    serve_check), and progress reported after it, not from these threads: the stage's callbacks may use the
    database, and a connection opened by a short-lived thread would outlive it."""
    if not MIN_CONCURRENCY <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be between {MIN_CONCURRENCY} and {MAX_CONCURRENCY}, got {concurrency}")
    total = max(concurrency, len(prompts))
    url = f"{base_url}/v1/completions"
    lock = threading.Lock()
    handed = 0
    answers: list[tuple[int, float, float | None]] = []

    def client() -> None:
        nonlocal handed
        while True:
            with lock:
                if handed >= total:
                    return
                n, handed = handed, handed + 1
            body = {"model": model, "prompt": prompts[n % len(prompts)], "max_tokens": max_new_tokens,
                    "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
            try:
                answer = _stream_one(url, body, request_timeout_s)
            except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
                raise LoadError(f"request {n} at concurrency {concurrency}: {exc}") from None
            with lock:
                answers.append(answer)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="serve-load") as pool:
        futures = [pool.submit(client) for _ in range(concurrency)]
        for future in futures:
            future.result()  # the first client's error, raised here
    seconds = time.perf_counter() - started
    tokens = sum(a[0] for a in answers)
    per_token = [(s - first) / (n - 1) for n, s, first in answers if n > 1 and first is not None]
    return LoadFigures(concurrency=concurrency, requests=total, output_tokens=tokens, seconds=seconds,
                       tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
                       tpot_ms=1000 * sum(per_token) / len(per_token) if per_token else None)


def speedup_table(*, with_draft: list[LoadFigures], without: list[LoadFigures], device: str) -> list[dict]:
    """One row per concurrency: both sides' figures and the speed-up; `device` "cpu" or "gpu" labels them."""
    by_level = {f.concurrency: f for f in without}
    rows = []
    for w in with_draft:
        o = by_level[w.concurrency]
        rows.append({"concurrency": w.concurrency, "requests": w.requests, "device": device,
                     "output_tokens_with": w.output_tokens, "output_tokens_without": o.output_tokens,
                     "seconds_with": round(w.seconds, 4), "seconds_without": round(o.seconds, 4),
                     "tokens_per_s_with": w.tokens_per_s, "tokens_per_s_without": o.tokens_per_s,
                     "tpot_ms_with": w.tpot_ms, "tpot_ms_without": o.tpot_ms,
                     "speedup": w.tokens_per_s / o.tokens_per_s if o.tokens_per_s > 0 else None})
    return rows
