"""Extract stage on vLLM: the same files as workers.stages.extract.with_transformers, computed by `vllm serve`.

Why vLLM: a target too large for one GPU runs tensor-parallel there, with vLLM's batching and
kernels, which is how speculators itself generates EAGLE-3 data. What upstream does, and we copy:

* speculators `scripts/launch_vllm.py` execs `vllm serve MODEL --speculative_config S
  --kv_transfer_config K [vLLM args after --]` with S = {"method": "extract_hidden_states",
  "num_speculative_tokens": 1, "draft_model_config": {"hf_config":
  {"eagle_aux_hidden_state_layer_ids": LAYER_IDS}}} and, for its default "file" backend
  (hs_connectors/transfer.py `FileBackend.build_kv_transfer_config`), K = {"kv_connector":
  "ExampleHiddenStatesConnector", "kv_role": "kv_producer", "kv_connector_extra_config":
  {"shared_storage_path": DIR}}. LAYER_IDS ends with num_hidden_layers (--include-last-layer).
  Tensor parallelism is an ordinary vLLM argument: `--tensor-parallel-size N`.
* Layer ids mean what ours mean (workers.stages.extract.with_transformers): vLLM's models append
  `hidden_states + residual` entering decoder layer i for id i, and for id N (`end_layer`) the
  same sum before the final norm, i.e. HF `hidden_states[i]` and the pre-norm last state.
* speculators `scripts/data_generation_offline.py` waits for GET /health (its example scripts
  poll it), then, per dataset row, `speculators.data_generation.vllm_client.generate_hidden_states`
  POSTs /v1/completions with `prompt` = the row's token ids (not re-tokenized), `max_tokens=1` and
  `return_token_ids=True`; it checks `choices[0].prompt_token_ids` equals the row and takes the
  file path from the response's `kv_transfer_params["hidden_states_path"]`.
* vLLM's connector (vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py)
  names that file `{shared_storage_path}/{request_id}.safetensors`, holding `hidden_states`
  [T, L, H] in the model dtype (the hidden-states cache: [tokens, layers, hidden]) and
  `token_ids` int64 [T] (the prompt), written by a thread pool after the response while an
  exclusive flock on `{file}.lock` is held. The client waits for that lock
  (`vllm_client.wait_for_lock`), moves the file to `hs_{row}.safetensors` and, with
  --validate-outputs, runs `offline.check_hidden_states` on it.

So this stage starts that server (own process group, a free port on 127.0.0.1, its log in
out_dir/vllm_server.log) with the connector writing to out_dir/vllm_staging, waits for health,
sends the rows the resume record (workers.stages.extract.resume) does not already hold, checks
each file (keys, int64 token ids equal to the row, bf16 [T, L, H], finite), sorts its header's metadata
keys (workers.stages.extract.output.stable_header: safetensors writes them in a random order) and moves it to
hidden_states/hs_{i}.safetensors, stops the server on every way out, and writes data_config.json
as extract() does. `--dtype bfloat16` makes vLLM compute and store bf16 whatever the config says;
`--max-model-len` is the longest row plus the one token each request generates.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from workers.contract.errors import InputError, StopRequested
from workers.stages.extract.output.result import HIDDEN_STATES_DIRNAME, MANIFEST_NAME, ExtractionResult, write_manifest
from workers.stages.extract.batch_plan import open_prepared
from workers.stages.extract.resume import (
    extraction_fingerprint,
    resume_or_start,
)
from workers.stages.extract.shards import ExtractionShard, shard_fingerprint
from workers.stages.extract.output.stable_header import sort_header_metadata
from workers.contract.progress import ProgressFn
from workers.contract.target import read_target_config, read_target_json, validate_layer_ids
from workers.contract.host.vllm_env import hidden_states_connector, kvcache_gib, server_environment, vllm_install_at
from workers.stages.extract.vllm_server import VllmServer, VllmServerError, free_port, log_tail, serve_command

log = logging.getLogger(__name__)

STAGING_DIRNAME = "vllm_staging"
LOG_NAME = "vllm_server.log"
STORE_DTYPE = "bfloat16"
DEFAULT_STARTUP_TIMEOUT_S = 1800.0  # a 70B target loads and captures its CUDA graphs in minutes
DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_CONCURRENCY = 32  # speculators' data_generation_offline.py --concurrency default
LOCK_TIMEOUT_S = 120.0
POLL_S = 0.5
ID_CHUNK = 256


class ExtractionStopped(StopRequested):
    """should_stop() asked the extraction to end; every sample already moved into place is whole."""


class VllmOutputError(RuntimeError):
    """vLLM answered a request wrongly or wrote a file that is not the row's sample; names the sample."""


@dataclass(frozen=True)
class _Done:
    index: int
    tokens: int
    nbytes: int


def _refuse_foreign_tokens(input_ids, vocab_size: int, prepared_dir: Path) -> None:
    import pyarrow.compute as pc

    max_id = pc.max(pc.list_flatten(input_ids)).as_py()
    if max_id is not None and max_id >= vocab_size:
        raise InputError(f"{prepared_dir}: token id {max_id} is outside the target's vocabulary "
                         f"({vocab_size}); was it prepared with another tokenizer?")


def max_model_len(target_dir: Path, lengths: list[int]) -> int:
    """The longest row plus the token each request generates, refused past the target's positions."""
    needed = max(lengths) + 1
    raw = read_target_json(target_dir)
    config = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool) and needed > positions:
        row = lengths.index(max(lengths))
        raise InputError(
            f"row {row} has {max(lengths)} tokens; vLLM needs room for it plus one generated token "
            f"within the target's {positions} positions: prepare with max_seq_len <= {positions - 1}, "
            "or extract with the transformers backend")
    return needed


def _clear_staging(staging: Path) -> int:
    """Files a killed attempt left half-moved; they are vLLM's names, never a finished sample."""
    removed = 0
    if staging.is_dir():
        for entry in os.scandir(staging):
            if entry.is_file() and entry.name.endswith((".safetensors", ".safetensors.lock")):
                os.unlink(entry.path)
                removed += 1
    staging.mkdir(parents=True, exist_ok=True)
    return removed


def check_sample(path: Path, *, index: int, token_ids: list[int], num_layers: int, hidden_size: int) -> None:
    """Raise VllmOutputError naming hs_{index} unless the file is row index's whole sample."""
    import torch
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states

    name = f"hs_{index}.safetensors (vLLM wrote {path.name})"
    try:
        data = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for a truncated or foreign file
        raise VllmOutputError(f"{name}: unreadable: {exc}") from None
    if set(data) != {"token_ids", "hidden_states"}:
        raise VllmOutputError(f"{name}: holds tensors {sorted(data)}, expected token_ids and hidden_states")
    ids, hidden = data["token_ids"], data["hidden_states"]
    if ids.dtype != torch.int64:
        raise VllmOutputError(f"{name}: token_ids are {ids.dtype}, expected torch.int64")
    want = (len(token_ids), num_layers, hidden_size)
    if hidden.dtype != torch.bfloat16 or tuple(hidden.shape) != want:
        raise VllmOutputError(f"{name}: hidden_states are {hidden.dtype} {list(hidden.shape)}, expected "
                              f"torch.bfloat16 {list(want)} (tokens, layers, hidden size)")
    try:
        check_hidden_states(data, token_ids)  # speculators' own check: token ids equal the row, finite
    except ValueError as exc:
        raise VllmOutputError(f"{name}: {str(exc)[:300]}") from None


def _fetch_sample(*, client, model_id: str, index: int, token_ids: list[int], staging: Path, hs_dir: Path,
                  num_layers: int, hidden_size: int, request_timeout_s: float) -> _Done:
    """One row through vLLM, checked and moved into place (a worker thread runs this)."""
    from speculators.data_generation.vllm_client import generate_hidden_states, wait_for_lock

    try:
        handle, _ = generate_hidden_states(client, model_id, {"input_ids": token_ids},
                                           timeout=request_timeout_s, max_retries=0)
    except Exception as exc:  # openai's connection/status errors or speculators' InvalidResponseError
        raise VllmOutputError(f"sample {index} ({len(token_ids)} tokens): vLLM request failed: "
                              f"{type(exc).__name__}: {str(exc)[:300]}") from None
    written = Path(handle)
    if written.parent.resolve() != staging.resolve():
        raise VllmOutputError(f"sample {index}: vLLM wrote {written}, outside {staging}; "
                              "is another vLLM server listening on this port?")
    lock = f"{written}.lock"
    if os.path.exists(lock):  # the connector's writer thread holds it until the file is complete
        try:
            wait_for_lock(lock, timeout=LOCK_TIMEOUT_S)
        except TimeoutError:
            raise VllmOutputError(f"sample {index}: vLLM did not finish writing {written} within "
                                  f"{LOCK_TIMEOUT_S:.0f} s (its lock file is still held)") from None
    check_sample(written, index=index, token_ids=token_ids, num_layers=num_layers, hidden_size=hidden_size)
    try:  # the connector's header stamp comes out in a random key order: one order, so one sample is one byte string
        sort_header_metadata(written)
    except ValueError as exc:
        raise VllmOutputError(f"sample {index}: {exc}") from None
    target = hs_dir / f"hs_{index}.safetensors"
    os.replace(written, target)  # same filesystem (both under out_dir): a sample is whole or absent
    return _Done(index=index, tokens=len(token_ids), nbytes=target.stat().st_size)


def install_and_environment(executable: str, *, target_dir: Path, max_model_len: int, concurrency: int,
                             cached_bytes_per_token: int):
    """The vLLM behind `executable` (None when it cannot be told: the server's own start then says
    what is wrong) and the environment its server needs (on the CPU build: KV cache and connector)."""
    resolved = shutil.which(executable) or executable
    install = vllm_install_at(resolved) if os.path.isfile(resolved) else None
    if install is None or isinstance(install, str):
        return None, None
    raw = read_target_json(target_dir)
    config = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    space = kvcache_gib(target_config=config, max_model_len=max_model_len, concurrency=concurrency,
                        extra_bytes_per_token=cached_bytes_per_token)
    return install, server_environment(install, kvcache_space_gib=space)


def _rows(input_ids, todo: list[int]) -> Iterator[tuple[int, list[int]]]:
    for start in range(0, len(todo), ID_CHUNK):
        chunk = todo[start:start + ID_CHUNK]
        yield from zip(chunk, input_ids.take(chunk).to_pylist())


def extract_with_vllm(
    *,
    target_dir: Path,
    prepared_dir: Path,
    out_dir: Path,
    layer_ids: list[int],
    tensor_parallel_size: int = 1,
    vllm_executable: str = "vllm",
    port: int | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    concurrency: int = DEFAULT_CONCURRENCY,
    on_progress: ProgressFn | None = None,
    should_stop: Callable[[], bool] | None = None,
    rows: range | None = None,
) -> ExtractionResult | ExtractionShard:
    """Hidden states for every prepared row from `vllm serve`, in extract()'s layout and manifest.

    out_dir must be absent, empty, or an earlier attempt of this same extraction (by either
    backend): the samples it holds whole are kept and never sent to vLLM again.

    rows: one shard of a split extraction (workers.stages.extract.shards): these prepared rows only (a
    request is one row, so the prepared order is the order), into out_dir (the shard's folder), and no
    manifest (extract_merge writes it). Returns an ExtractionShard then."""
    started = time.perf_counter()
    target_dir, prepared_dir, out_dir = Path(target_dir), Path(prepared_dir), Path(out_dir)
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise InputError(f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size!r}")
    if concurrency < 1:
        raise InputError(f"concurrency must be at least 1, got {concurrency!r}")
    target = read_target_config(target_dir)
    layer_ids = validate_layer_ids(list(layer_ids), target.num_layers)
    data, lengths = open_prepared(prepared_dir)
    num_rows, input_ids = len(lengths), data.data.table.column("input_ids")
    _refuse_foreign_tokens(input_ids, target.vocab_size, prepared_dir)
    model_len = max_model_len(target_dir, lengths)

    fingerprint = extraction_fingerprint(target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                                         dtype=STORE_DTYPE, num_rows=num_rows)
    wanted = range(num_rows)
    if rows is not None:
        if not 0 <= rows.start < rows.stop <= num_rows:
            raise ValueError(f"rows {rows.start}..{rows.stop} are not a span of the {num_rows} prepared rows")
        wanted, fingerprint = rows, shard_fingerprint(fingerprint, rows)
    hs_dir, reused, resumable = resume_or_start(
        out_dir=out_dir, fingerprint=fingerprint, hs_dirname=HIDDEN_STATES_DIRNAME, manifest_name=MANIFEST_NAME,
        input_ids=input_ids, num_layers=len(layer_ids), hidden_size=target.hidden_size)
    num_layers, hidden_size = len(layer_ids), target.hidden_size
    kept = set(reused.indices)
    todo = [i for i in wanted if i not in kept]
    total = len(wanted)
    staging = out_dir / STAGING_DIRNAME
    leftovers = _clear_staging(staging)
    if resumable:
        log.info("resuming %s: %d of %d samples kept, %d incomplete redone, %d staged files of a killed attempt removed",
                 out_dir, len(kept), num_rows, reused.redone, leftovers)

    done, tokens_extracted, nbytes = len(kept), 0, reused.nbytes
    step = max(1, total // 100)
    startup_seconds = generate_seconds = 0.0
    if on_progress is not None and done:
        on_progress(done, total)

    def stopped() -> ExtractionStopped:
        return ExtractionStopped(f"extraction stopped on request with {done} of {total} samples written; "
                                 "a retry keeps them")

    if todo:  # a resumed extraction with nothing left to do never starts a server
        port = port or free_port()
        install, env = install_and_environment(vllm_executable, target_dir=target_dir, max_model_len=model_len,
                                                concurrency=concurrency, cached_bytes_per_token=num_layers * hidden_size * 2)
        command = serve_command(vllm_executable=vllm_executable, target_dir=target_dir, layer_ids=layer_ids,
                                staging_dir=staging.resolve(), tensor_parallel_size=tensor_parallel_size,
                                port=port, max_model_len=model_len, dtype=STORE_DTYPE,
                                connector=hidden_states_connector(install))
        server = VllmServer(command=command, log_path=out_dir / LOG_NAME, port=port, env=env)
        log.info("starting %s", " ".join(command))
        with server:
            startup_seconds = server.wait_healthy(timeout_s=startup_timeout_s, should_stop=should_stop,
                                                  on_stop=stopped)
            t0 = time.perf_counter()
            samples = _generate(server=server, model_id=str(target_dir), rows=_rows(input_ids, todo), staging=staging,
                                hs_dir=hs_dir, num_layers=num_layers, hidden_size=hidden_size,
                                request_timeout_s=request_timeout_s, concurrency=concurrency,
                                should_stop=should_stop, on_stop=stopped)
            # closing(): whatever ends the loop (a stop, an error, on_progress raising), the
            # generator's cleanup runs before the server is stopped.
            with closing(samples):
                for finished in samples:
                    prev, done = done, done + 1
                    tokens_extracted += finished.tokens
                    nbytes += finished.nbytes
                    if on_progress is not None and (done // step != prev // step or done == total):
                        on_progress(done, total)
            generate_seconds = time.perf_counter() - t0
    shutil.rmtree(staging, ignore_errors=True)
    if rows is not None:
        log.info("vLLM shard rows %d..%d: extracted %d rows (%d kept from an earlier attempt), %d tokens",
                 rows.start, rows.stop, len(todo), len(kept), tokens_extracted)
        return ExtractionShard(
            row_start=rows.start, row_stop=rows.stop, out_dir=str(out_dir), num_samples=total,
            samples_reused=len(kept), tokens_reused=reused.tokens, tokens_extracted=tokens_extracted,
            bytes_on_disk=nbytes, model_load_seconds=startup_seconds, forward_seconds=generate_seconds,
            total_seconds=time.perf_counter() - started, device=f"vllm (tensor parallel {tensor_parallel_size})")

    result = write_manifest(
        out_dir=out_dir, hs_dir=hs_dir, target_dir=target_dir, prepared_dir=prepared_dir, lengths=lengths,
        layer_ids=layer_ids, hidden_size=hidden_size, dtype=STORE_DTYPE, tp_size=tensor_parallel_size,
        started=started,
        model_load_seconds=startup_seconds,  # vllm serve's start until /health answered
        forward_seconds=generate_seconds,  # the requests, wall clock
        reused=reused, tokens_extracted=tokens_extracted, bytes_on_disk=nbytes,
        device=f"vllm (tensor parallel {tensor_parallel_size})", extra={"extraction_backend": "vllm"})
    log.info("vLLM extracted %d rows (%d kept from an earlier attempt), %d tokens in %.1f s (%.0f tok/s, TP %d)",
             len(todo), len(kept), tokens_extracted, result.total_time_seconds, result.tokens_per_second,
             tensor_parallel_size)
    return result


def _generate(*, server: VllmServer, model_id: str, rows: Iterator[tuple[int, list[int]]], staging: Path,
              hs_dir: Path, num_layers: int, hidden_size: int, request_timeout_s: float, concurrency: int,
              should_stop: Callable[[], bool] | None, on_stop: Callable[[], Exception]) -> Iterator[_Done]:
    """Each row's finished sample, in completion order, with at most `concurrency` requests in flight.

    The first failure ends it; so do should_stop() and the server's death (quoting its log)."""
    import openai

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="EMPTY", max_retries=0)
    try:
        served = [m.id for m in client.models.list().data]
    except openai.OpenAIError as exc:
        client.close()
        raise VllmServerError(f"GET {server.base_url}/v1/models failed: {exc}; last lines of "
                              f"{server.log_path}:\n{log_tail(server.log_path)}") from None
    if model_id not in served:
        client.close()
        raise VllmServerError(f"{server.base_url} serves {served}, not {model_id}; is another server on this port?")
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vllm-extract")
    in_flight: set[Future] = set()
    try:
        for index, ids in rows:
            while len(in_flight) >= concurrency:
                finished, in_flight = _wait_some(in_flight, server)
                yield from finished
                if should_stop is not None and should_stop():
                    raise on_stop()
            in_flight.add(pool.submit(
                _fetch_sample, client=client, model_id=model_id, index=index, token_ids=ids, staging=staging,
                hs_dir=hs_dir, num_layers=num_layers, hidden_size=hidden_size, request_timeout_s=request_timeout_s))
        while in_flight:
            finished, in_flight = _wait_some(in_flight, server)
            yield from finished
            if in_flight and should_stop is not None and should_stop():
                raise on_stop()
    finally:
        # On a failure or a stop the requests still in flight end fast once the server is gone;
        # until then they may still move whole, checked samples into place, which a retry keeps.
        pool.shutdown(wait=False, cancel_futures=True)
        if in_flight:
            server.stop()
            wait(in_flight)
        client.close()


def _wait_some(in_flight: set[Future], server: VllmServer) -> tuple[list[_Done], set[Future]]:
    """The samples finished within POLL_S and the requests still in flight; a failed request
    raises its error, or the server's own when it died (a dead server fails every request)."""
    finished, pending = wait(in_flight, timeout=POLL_S, return_when=FIRST_COMPLETED)
    failed = [f.exception() for f in finished if f.exception() is not None]
    # A request cut off by a dying server can fail a moment before the process has exited.
    why = server.died(grace_s=2.0 if failed else 0.0) if failed or not finished else None
    if why is not None:
        raise VllmServerError(f"vllm serve died during extraction: {why}")
    if failed:
        raise failed[0]
    return [f.result() for f in finished], pending
