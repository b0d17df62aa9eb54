"""Serve check: vLLM itself serves the target with the draft and says how many drafted tokens it accepted.

Our evaluate stage measures τ with our own decoding loop (workers/stages/evaluate/speculative.py); this stage
asks the engine users deploy. It starts `vllm serve` with exactly the line a checkpoint's page prints
(workers.contract.checkpoints.serving.vllm_serve_command) plus the serving settings of this check (port, dtype,
context length), sends each prompt as token ids to /v1/completions (greedy, one at a time), reads
vLLM's speculative-decoding counters from /metrics (`vllm:spec_decode_num_drafts_total`,
`..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total`) and its count of decode steps
(`vllm:inter_token_latency_seconds_count`: one observation per step that emitted tokens after a
request's first), then serves the target alone with the same settings and the same prompts.

vLLM's acceptance length, as its own logs and dashboards compute it, is 1 + accepted / drafts; per
position i, accepted_per_pos[i] / drafts. Those counters include drafts accepted in a request's last
step past max_tokens (or EOS), which the output never shows; our τ counts only emitted tokens. So the
figure compared with ours is our definition on vLLM's side (`vllm_tau_emitted`, emitted_tau below):
the tokens emitted by the steps that had drafts, over those steps. A decode step vLLM ran without
drafts (none scheduled, e.g. near the context's end) emitted exactly one token and is left out of both,
as our loop, which drafts at every step, has no such step. The per-position figures cannot be put on
that footing from counters summed over all steps (the drafts a reply's end cuts lie in its last step,
at positions that step's acceptance decides), so they are kept as vLLM's counters say, not beside ours.

After the prompts one at a time (τ and the texts), each server takes the load of every concurrency level
asked (workers.stages.evaluate.serve_load): output tokens/s and time per output token with the draft and
without, and the speed-up, one row per level (`concurrency_results`), labelled with the device vLLM ran
on (its CPU build: "cpu", figures that show the draft serves, not what a GPU gains).

The prompts are hashed (prompts_digest) so that the record says which list both sides decoded.

Like with like: the target runs in the dtype our evaluation loads it in (its config's), since vLLM
would otherwise downcast a float32 target to bfloat16. Pure: no Django, no torch (vLLM runs in its
own environment, workers.contract.host.vllm_env).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workers.contract.errors import InputError, StopRequested
from workers.contract.checkpoints.serving import checkpoint_speculative_tokens, vllm_serve_command
from workers.contract.target import read_target_json, target_dtype
from workers.contract.host.vllm_env import kvcache_gib, server_environment, vllm_install_at
from workers.stages.evaluate.serve_load import LoadError, LoadFigures, load_measure, speedup_table
from workers.stages.extract.vllm_server import HOST, VllmServer, VllmServerError, free_port, log_tail

log = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 1800.0
DEFAULT_REQUEST_TIMEOUT_S = 600.0
WITH_LOG, WITHOUT_LOG = "vllm_serve_with_draft.log", "vllm_serve_target_only.log"
# vLLM 0.32's exposition: `name{engine="0",model_name="..."} 12.0`; the per-position counter adds position="i".
_COUNTER = re.compile(r'^(vllm:spec_decode_num_[a-z_]+_total|vllm:inter_token_latency_seconds_count)'
                      r'(\{[^}]*\})?\s+([0-9.eE+-]+)$')
_POSITION = re.compile(r'position="(\d+)"')


class ServeCheckError(InputError):
    """The check cannot run as asked (no vLLM here, no prompts, a prompt too long); says why."""


class ServeCheckStopped(StopRequested):
    """should_stop() asked the check to end; the servers are stopped."""


@dataclass(frozen=True)
class SpecCounters:
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]
    decode_steps: int | None = None  # None: the page has no inter-token latency histogram


@dataclass(frozen=True)
class ServeCheckResult:
    checkpoint_dir: Path
    target_dir: Path
    num_prompts: int
    prompts_count: int  # the list served, as prompts_digest names it
    prompts_sha256: str
    max_new_tokens: int
    num_speculative_tokens: int
    dtype: str
    command: str  # the page's line this check served the draft with, and the settings it added
    vllm_version: str
    vllm_build: str
    vllm_tau: float  # vLLM's counters: 1 + accepted / drafts
    vllm_tau_emitted: float  # tokens emitted by the steps with drafts / those steps: our τ's definition
    vllm_acceptance_per_position: list[float]  # vLLM's counters, past a reply's end included
    vllm_drafts: int
    vllm_decode_steps: int | None  # steps after each prompt's first token, with drafts or without
    vllm_draft_tokens: int
    vllm_accepted_tokens: int
    vllm_output_matches_greedy: bool
    mismatched_prompts: list[int]
    vllm_new_tokens: int
    vllm_replies_cut: int  # replies that stopped at max_new_tokens; the others ended at the target's end token
    vllm_tokens_per_s_with: float
    vllm_tokens_per_s_without: float
    vllm_speedup: float
    startup_seconds: float
    seconds: float
    concurrency: list[int] = field(default_factory=list)  # the load's levels, as asked
    concurrency_results: list[dict] = field(default_factory=list)  # serve_load.speedup_table: a row per level
    outputs_with: list[list[int]] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["checkpoint_dir"], d["target_dir"] = str(self.checkpoint_dir), str(self.target_dir)
        return d


def parse_spec_counters(metrics_text: str, *, k: int) -> SpecCounters:
    """vLLM's speculative-decoding counters from a /metrics page (summed over engines)."""
    totals: dict[str, float] = {}
    per_position = [0.0] * k
    for line in metrics_text.splitlines():
        match = _COUNTER.match(line.strip())
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            position = _POSITION.search(labels)
            if position and int(position.group(1)) < k:
                per_position[int(position.group(1))] += value
        else:
            totals[name] = totals.get(name, 0.0) + value
    steps = totals.get("vllm:inter_token_latency_seconds_count")
    return SpecCounters(drafts=int(totals.get("vllm:spec_decode_num_drafts_total", 0)),
                        draft_tokens=int(totals.get("vllm:spec_decode_num_draft_tokens_total", 0)),
                        accepted_tokens=int(totals.get("vllm:spec_decode_num_accepted_tokens_total", 0)),
                        accepted_per_position=[int(v) for v in per_position],
                        decode_steps=None if steps is None else int(steps))


def prompts_digest(prompts: list[list[int]]) -> tuple[int, str]:
    """(count, sha256) of a prompt list: its token ids as compact JSON, so that two records name the
    same list exactly when they hold the same hash."""
    text = json.dumps([[int(t) for t in p] for p in prompts], separators=(",", ":"))
    return len(prompts), hashlib.sha256(text.encode()).hexdigest()


def emitted_tau(*, outputs: list[list[int]], drafts: int, decode_steps: int | None) -> tuple[float, int]:
    """(τ on emitted tokens, steps without drafts) from what vLLM emitted and counted between two scrapes.

    Every decode step emitted at least one token, so the steps without drafts emitted exactly one each
    (decode_steps − drafts of them); the rest of the tokens after each prompt's first came from the
    drafted steps. `decode_steps` None (a vLLM without the histogram) is read as every step drafted."""
    emitted = sum(max(0, len(o) - 1) for o in outputs)
    undrafted = 0 if decode_steps is None else decode_steps - drafts
    if drafts <= 0 or undrafted < 0 or emitted - undrafted < drafts:
        raise VllmServerError(f"vLLM's counters do not add up: {drafts} drafts, {decode_steps} decode steps, "
                              f"{emitted} tokens emitted after each prompt's first")
    return (emitted - undrafted) / drafts, undrafted


def serve_check_commands(*, vllm_executable: str, target_dir: Path, checkpoint_dir: Path, k: int, dtype: str,
                         max_model_len: int, port: int, tensor_parallel_size: int) -> tuple[list[str], list[str]]:
    """(with the draft, the target alone): the page's `vllm serve` line, then this check's settings."""
    page_line = shlex.split(vllm_serve_command(verifier=str(target_dir), checkpoint_dir=str(checkpoint_dir),
                                               num_speculative_tokens=k))
    settings = ["--dtype", dtype, "--max-model-len", str(max_model_len), "--tensor-parallel-size",
                str(tensor_parallel_size), "--host", HOST, "--port", str(port)]
    with_draft = [vllm_executable, *page_line[1:], *settings]
    return with_draft, [vllm_executable, "serve", str(target_dir), *settings]


def _post_json(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _get_text(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def _complete_all(server: VllmServer, *, model: str, prompts: list[list[int]], max_new_tokens: int,
                  request_timeout_s: float, tick: Callable[[], None], should_stop: Callable[[], bool] | None,
                  ) -> tuple[list[list[int]], list[str], float]:
    """Each prompt's greedy completion (token ids), why it ended ("length" at max_tokens, "stop" at the
    end token) and the seconds the requests took, one at a time."""
    outputs, reasons, seconds = [], [], 0.0
    for n, prompt in enumerate(prompts):
        if should_stop is not None and should_stop():
            raise ServeCheckStopped(f"serve check stopped on request after {n} of {len(prompts)} prompts")
        body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0.0,
                "return_token_ids": True}
        started = time.perf_counter()
        try:
            answer = _post_json(f"{server.base_url}/v1/completions", body, request_timeout_s)
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
            why = server.died(grace_s=2.0)
            detail = f"; {why}" if why else f"; last lines of {server.log_path}:\n{log_tail(server.log_path)}"
            raise VllmServerError(f"prompt {n} ({len(prompt)} tokens): vLLM's completion failed: {exc}{detail}") from None
        seconds += time.perf_counter() - started
        choice = answer["choices"][0]
        if choice.get("prompt_token_ids") not in (None, prompt):
            raise VllmServerError(f"prompt {n}: vLLM answered for other prompt tokens than it was sent")
        outputs.append([int(t) for t in choice.get("token_ids") or []])
        reasons.append(str(choice.get("finish_reason")))
        tick()
    return outputs, reasons, seconds


def _load_all(server: VllmServer, *, model: str, prompts: list[list[int]], max_new_tokens: int,
              concurrency: list[int], request_timeout_s: float, tick: Callable[[int], None],
              should_stop: Callable[[], bool] | None) -> list[LoadFigures]:
    figures = []
    for level in concurrency:
        if should_stop is not None and should_stop():
            raise ServeCheckStopped(f"serve check stopped on request before its load at concurrency {level}")
        try:
            figures.append(load_measure(base_url=server.base_url, model=model, prompts=prompts,
                                        max_new_tokens=max_new_tokens, concurrency=level,
                                        request_timeout_s=request_timeout_s))
        except LoadError as exc:
            why = server.died(grace_s=2.0)
            detail = f"; {why}" if why else f"; last lines of {server.log_path}:\n{log_tail(server.log_path)}"
            raise VllmServerError(f"{exc}{detail}") from None
        tick(figures[-1].requests)
    return figures


def serve_check(
    *,
    target_dir: Path,
    checkpoint_dir: Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    out_dir: Path,
    vllm_executable: str,
    num_speculative_tokens: int | None = None,
    tensor_parallel_size: int = 1,
    concurrency: list[int] | tuple[int, ...] = (1,),
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ServeCheckResult:
    """Serve the target with the draft, then alone, on the same prompts; vLLM's τ and whether the texts agree."""
    started = time.monotonic()
    target_dir, checkpoint_dir, out_dir = Path(target_dir), Path(checkpoint_dir), Path(out_dir)
    if not prompts:
        raise ServeCheckError("no prompts to serve")
    if max_new_tokens < 1:
        raise ServeCheckError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    concurrency = sorted(set(concurrency))
    if not concurrency or not all(isinstance(c, int) and 1 <= c <= 256 for c in concurrency):
        raise ServeCheckError(f"concurrency must be whole numbers between 1 and 256, got {concurrency}")
    install = vllm_install_at(vllm_executable)
    if isinstance(install, str):
        raise ServeCheckError(f"cannot check with vLLM on this worker: {install}")
    k = num_speculative_tokens or checkpoint_speculative_tokens(checkpoint_dir)
    raw = read_target_json(target_dir)
    config = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    needed = max(len(p) for p in prompts) + max_new_tokens + k + 1
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and needed > positions:
        raise ServeCheckError(f"the longest prompt ({max(len(p) for p in prompts)} tokens) plus {max_new_tokens} new "
                              f"tokens and {k} drafted ones exceed the target's {positions} positions; lower max_new_tokens")
    # k more than the tokens verified: vLLM drafts for the next step only while the sequence plus the
    # drafts still fits (its model runner's _input_fits_in_drafter) and otherwise schedules zeros as
    # drafts, rejected, where our loop drafts for real; the headroom keeps that from happening.
    max_model_len = needed + k if not isinstance(positions, int) else min(needed + k, positions)
    count, digest = prompts_digest(prompts)
    dtype = target_dtype(target_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = server_environment(install, kvcache_space_gib=kvcache_gib(target_config=config, max_model_len=max_model_len,
                                                                    concurrency=max(concurrency)))
    total = 2 * (len(prompts) + sum(max(c, len(prompts)) for c in concurrency))
    done = 0

    def tick(count: int = 1) -> None:
        nonlocal done
        done += count
        if on_progress is not None:
            on_progress(done, total)

    def stopped() -> Exception:
        return ServeCheckStopped("serve check stopped on request while vLLM was starting")

    with_draft, target_only = serve_check_commands(
        vllm_executable=install.executable, target_dir=target_dir, checkpoint_dir=checkpoint_dir, k=k, dtype=dtype,
        max_model_len=max_model_len, port=free_port(), tensor_parallel_size=tensor_parallel_size)
    log.info("serving with the draft: %s", shlex.join(with_draft))
    with VllmServer(command=with_draft, log_path=out_dir / WITH_LOG, port=int(with_draft[-1]), env=env) as server:
        startup = server.wait_healthy(timeout_s=startup_timeout_s, should_stop=should_stop, on_stop=stopped)
        before = parse_spec_counters(_get_text(f"{server.base_url}/metrics"), k=k)
        outputs_with, reasons, seconds_with = _complete_all(
            server, model=str(target_dir), prompts=prompts, max_new_tokens=max_new_tokens,
            request_timeout_s=request_timeout_s, tick=tick, should_stop=should_stop)
        after = parse_spec_counters(_get_text(f"{server.base_url}/metrics"), k=k)
        load_with = _load_all(server, model=str(target_dir), prompts=prompts, max_new_tokens=max_new_tokens,
                              concurrency=concurrency, request_timeout_s=request_timeout_s, tick=tick,
                              should_stop=should_stop)
    target_only[-1] = str(free_port())
    log.info("serving the target alone: %s", shlex.join(target_only))
    with VllmServer(command=target_only, log_path=out_dir / WITHOUT_LOG, port=int(target_only[-1]), env=env) as server:
        server.wait_healthy(timeout_s=startup_timeout_s, should_stop=should_stop, on_stop=stopped)
        outputs_without, _, seconds_without = _complete_all(
            server, model=str(target_dir), prompts=prompts, max_new_tokens=max_new_tokens,
            request_timeout_s=request_timeout_s, tick=tick, should_stop=should_stop)
        load_without = _load_all(server, model=str(target_dir), prompts=prompts, max_new_tokens=max_new_tokens,
                                 concurrency=concurrency, request_timeout_s=request_timeout_s, tick=tick,
                                 should_stop=should_stop)
    drafts = after.drafts - before.drafts
    if drafts <= 0:
        raise VllmServerError(f"vLLM served {len(prompts)} prompts with the draft but counted no drafts in /metrics: "
                              f"was the draft loaded? Last lines of {out_dir / WITH_LOG}:\n{log_tail(out_dir / WITH_LOG)}")
    accepted = after.accepted_tokens - before.accepted_tokens
    # A series first observed after the first scrape started from zero, as the counters do.
    steps = None if after.decode_steps is None else after.decode_steps - (before.decode_steps or 0)
    tau_emitted, undrafted = emitted_tau(outputs=outputs_with, drafts=drafts, decode_steps=steps)
    if steps is None:
        log.warning("vLLM's /metrics has no vllm:inter_token_latency_seconds_count: every decode step is taken to "
                    "have had drafts")
    per_position = [(a - b) / drafts for a, b in zip(after.accepted_per_position, before.accepted_per_position)]
    mismatched = [i for i, (a, b) in enumerate(zip(outputs_with, outputs_without)) if a != b]
    new_tokens = sum(len(o) for o in outputs_with)
    result = ServeCheckResult(
        checkpoint_dir=checkpoint_dir, target_dir=target_dir, num_prompts=len(prompts), prompts_count=count,
        prompts_sha256=digest, max_new_tokens=max_new_tokens, num_speculative_tokens=k, dtype=dtype,
        command=shlex.join(with_draft), vllm_version=install.version, vllm_build=install.build,
        vllm_tau=1.0 + accepted / drafts, vllm_tau_emitted=tau_emitted, vllm_acceptance_per_position=per_position,
        vllm_drafts=drafts, vllm_decode_steps=steps, vllm_draft_tokens=after.draft_tokens - before.draft_tokens,
        vllm_accepted_tokens=accepted,
        vllm_output_matches_greedy=not mismatched, mismatched_prompts=mismatched, vllm_new_tokens=new_tokens,
        vllm_replies_cut=sum(r == "length" for r in reasons),
        vllm_tokens_per_s_with=new_tokens / seconds_with if seconds_with else 0.0,
        vllm_tokens_per_s_without=sum(len(o) for o in outputs_without) / seconds_without if seconds_without else 0.0,
        vllm_speedup=seconds_without / seconds_with if seconds_with else 0.0,
        startup_seconds=startup, seconds=time.monotonic() - started, outputs_with=outputs_with,
        concurrency=concurrency, concurrency_results=speedup_table(
            with_draft=load_with, without=load_without, device="cpu" if install.is_cpu else "gpu"))
    log.info("vLLM %s (%s build) served %s on %d prompts (sha256 %s): tau %.3f on emitted tokens (%d steps without "
             "drafts), its counters' %.3f, acceptance %s, %s output as the target alone",
             install.version, install.build, checkpoint_dir, count, digest[:12], tau_emitted, undrafted, result.vllm_tau,
             [round(p, 3) for p in per_position], "same" if not mismatched else f"DIFFERENT on {len(mismatched)} prompt(s) from")
    return result

