"""Extract stage: target hidden states for every prepared row, in speculators 0.9's layout.

Each row i of the prepared dataset becomes `out_dir/hidden_states/hs_{i}.safetensors` holding
`token_ids` (int64 [T]) and `hidden_states` (bf16 [T, L, H]), the file speculators' vLLM
connector writes and `hs_connectors.transfer.FileTransfer.get_cached` reads back with
`safetensors.torch.load_file`. `speculators.train.data.ArrowDataset._get_raw_data` then splits
it: `hidden_states[:, :-1]` (the aux layers, flattened to [T, (L-1)*H]) and
`hidden_states[:, -1]` as `verifier_last_hidden_states`, and requires `token_ids` to equal the
row's `input_ids`. The row index is the file index, so files keep the dataset's order.

Layer ids index Hugging Face `outputs.hidden_states`: id i < N is the input to decoder layer i.
The last id N is the final decoder layer's output BEFORE the model's final norm, because
`Eagle3DraftModel.forward` computes its targets as
`verifier_lm_head(verifier_norm(verifier_last_hidden_states))` with `verifier_norm` loaded from
the target's `model.norm.weight` (speculators `model.py`, `models/eagle3/core.py`); a post-norm
tensor would be normalised twice. transformers 5.x `capture_outputs` (tie_last_hidden_states)
replaces `hidden_states[N]` with the post-norm `last_hidden_state`, so we do not take index N
from `output_hidden_states`. Instead forward pre-hooks read each wanted tensor directly: the
input of decoder layer i for i < N and the input of the final norm for N. That gives the same
tensors as `output_hidden_states` for i < N (tests check it) while holding only L tensors, not
N+1, and skips the lm_head (logits would be [B, T, vocab] in fp32). Every forward runs the whole
base model (all decoder layers and the final norm) whichever layers are captured; `bare_forward`
runs the very same forwards without the hooks, as the baseline the stage is measured against.

On CUDA the forward loop does not wait for the host: each batch's layers are copied on a side
stream into reused pinned buffers (workers.stages.extract.host_copy.PinnedCopies) while the next
forward runs, and a writer thread (workers.stages.extract.output.writer.BoundedWriter) writes the files,
at most WRITES_IN_FLIGHT batches behind. `overlap=False` keeps the synchronous path (blocking
`.cpu()`, files written in the loop), which writes byte-identical files.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# The batches one worker runs, planned without torch (a split extraction's planner uses them too).
from workers.stages.extract.batch_plan import (  # noqa: E402
    batch_token_budget,
    open_prepared,
    plan_forward_batches,
)
from workers.stages.extract.output.files import WRITES_IN_FLIGHT, HiddenBatch, _write_staged, _writer  # noqa: E402
from workers.stages.extract.host_copy import (  # noqa: E402
    BlockingCopies,
    EventTimes,
    ForwardedBatch,
    PinnedCopies,
)
from workers.stages.extract.model import LayerCapture, decoder_parts, load_target, place_target  # noqa: E402
from workers.stages.extract.output.result import (  # noqa: E402
    HIDDEN_STATES_DIRNAME,
    MANIFEST_NAME,
    ExtractionResult,
    write_manifest,
)
from workers.stages.extract.resume import (  # noqa: E402
    extraction_fingerprint,
    resume_or_start,
)
from workers.stages.extract.shards import ExtractionShard, shard_fingerprint  # noqa: E402
from workers.contract.progress import ProgressFn  # noqa: E402
from workers.contract.target import read_target_config, validate_layer_ids  # noqa: E402
from workers.stages.torch_internals import release_pinned_host_cache  # noqa: E402

log = logging.getLogger(__name__)


STORE_DTYPE = torch.bfloat16


def _largest_batch_tokens(lengths: list[int], todo: list[int], batch_tokens: int) -> int:
    """Padded tokens (rows x longest row) of the largest batch the plan holds: what a buffer must fit."""
    plan = plan_forward_batches([lengths[i] for i in todo], batch_tokens)
    return max(len(b) * max(lengths[todo[j]] for j in b) for b in plan)


def _pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = 1
    if device.type == "cuda":
        # From pageable memory a copy waits for the device's queue to empty; from pinned memory the
        # loop goes on and launches this forward while the previous one still runs.
        return ids.pin_memory().to(device, non_blocking=True), mask.pin_memory().to(device, non_blocking=True)
    return ids.to(device), mask.to(device)


def _forward_batches(model, data, lengths: list[int], batch_tokens: int, layer_ids: list[int],
                     device: torch.device, only: list[int] | None = None, *,
                     capture: bool = True, batches: list[list[int]] | None = None) -> Iterator[ForwardedBatch]:
    """Every row (or the rows in `only`, or exactly `batches`: lists of row indices) through the base model,
    batch by batch in plan_forward_batches' order; with `capture`, each batch's requested layers stacked
    [B, T, L, H] in STORE_DTYPE, left on the device (the caller copies them when and how it likes)."""
    base, _, _ = decoder_parts(model)
    pad_id = model.config.pad_token_id if isinstance(model.config.pad_token_id, int) else 0
    input_ids = data.data.table.column("input_ids")
    hooks = LayerCapture(model, layer_ids) if capture else None
    todo = list(range(len(lengths))) if only is None else only
    if batches is None:
        batches = [[todo[j] for j in planned] for planned in plan_forward_batches([lengths[i] for i in todo],
                                                                                   batch_tokens)]
    try:
        for batch in batches:
            # One arrow gather per batch: data[i] per row would build a dict of every column.
            rows = input_ids.take(batch).to_pylist()
            ids, mask = _pad(rows, pad_id, device)
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
                if device.type == "cuda" else None
            started = time.perf_counter()
            if events is not None:
                events[0].record()
            # Scoped to the forward: an inference_mode held across `yield` would leak into the caller.
            with torch.inference_mode():
                base(input_ids=ids, attention_mask=mask, use_cache=False)
                hidden = hooks.stacked().to(STORE_DTYPE) if hooks is not None else None
            if events is not None:
                events[1].record()
            yield ForwardedBatch(batch, rows, hidden, started, events)
            del hidden  # the caller's reference is the only one: it decides when the device memory goes
    finally:
        if hooks is not None:
            hooks.remove()


def iter_hidden_states(model, data, lengths: list[int], batch_tokens: int, layer_ids: list[int],
                       device: torch.device, only: list[int] | None = None) -> Iterator[HiddenBatch]:
    """The captured layers for every row (or the rows in `only`), batch by batch in plan_forward_batches' order,
    each batch copied to the CPU before the next forward (extract(overlap=False)'s forwards and copies).

    extract()'s forwards without its checks, files or progress: the benchmark's bare loop drives
    this same generator, so the two differ only by the stage's own work.
    """
    with closing(_forward_batches(model, data, lengths, batch_tokens, layer_ids, device, only)) as batches:
        for forwarded in batches:
            hidden = forwarded.hidden.cpu()
            yield HiddenBatch(forwarded.indices, forwarded.rows, hidden, time.perf_counter() - forwarded.started)


def bare_forward(*, target_dir: Path, prepared_dir: Path, layer_ids: list[int], device: str = "auto",
                 num_gpus: int = 1, batch_tokens: int | None = None) -> dict:
    """The benchmark baseline: extract()'s forwards over every prepared row, nothing captured,
    copied or written. Same model load, batches, padding and base model (all decoder layers and the
    final norm, as extract() runs whichever layers it captures); `layer_ids` are only validated.

    Returns {tokens, seconds, tokens_per_s, batches, model_load_seconds}: seconds from the first
    batch's arrow gather to the last forward done on the device (synchronised), as extract()'s
    forward_seconds counts them."""
    target_dir, prepared_dir = Path(target_dir), Path(prepared_dir)
    target = read_target_config(target_dir)
    layer_ids = validate_layer_ids(list(layer_ids), target.num_layers)
    data, lengths = open_prepared(prepared_dir)
    dev, _ = place_target(num_gpus, device)
    t0 = time.perf_counter()
    model = load_target(target_dir, dev, num_gpus)
    model_load_seconds = time.perf_counter() - t0
    budget = batch_token_budget(dev.type, batch_tokens)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    batches = 0
    started = time.perf_counter()
    with closing(_forward_batches(model, data, lengths, budget, layer_ids, dev, capture=False)) as forwards:
        for _ in forwards:
            batches += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - started
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    tokens = sum(lengths)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "batches": batches, "model_load_seconds": model_load_seconds}


def extract(
    *,
    target_dir: Path,
    prepared_dir: Path,
    out_dir: Path,
    layer_ids: list[int],
    device: str = "auto",
    num_gpus: int = 1,
    batch_tokens: int | None = None,
    on_progress: ProgressFn | None = None,
    overlap: bool | None = None,
    rows: range | None = None,
) -> ExtractionResult | ExtractionShard:
    """Run the target over every prepared row and write hidden states plus data_config.json.

    num_gpus > 1 spreads the target over that many GPUs (load_target); `device` is then ignored.

    overlap: write files on a thread while the next forwards run (and on CUDA, copy each batch to
    pinned memory on a side stream); False: copy and write each batch before the next forward.
    None: overlapped on CUDA, synchronous on the CPU (see files._writer). The files are the same.

    out_dir must be absent, empty, or an earlier attempt of this same extraction (see
    workers.stages.extract.resume): then the samples it wrote whole are kept, not extracted again.

    rows: one shard of a split extraction (workers.stages.extract.shards): positions in the order one
    worker extracts the rows (the batch plan's); only their files are written, in the very batches one
    worker would run, into out_dir (the shard's folder), and no manifest (extract_merge writes it).
    Returns an ExtractionShard then."""
    import pyarrow.compute as pc

    started = time.perf_counter()
    target_dir, prepared_dir, out_dir = Path(target_dir), Path(prepared_dir), Path(out_dir)
    target = read_target_config(target_dir)
    layer_ids = validate_layer_ids(list(layer_ids), target.num_layers)
    data, lengths = open_prepared(prepared_dir)
    num_rows = len(lengths)
    input_ids = data.data.table.column("input_ids")
    max_id = pc.max(pc.list_flatten(input_ids)).as_py()
    if max_id is not None and max_id >= target.vocab_size:
        raise ValueError(
            f"{prepared_dir}: token id {max_id} is outside the target's vocabulary "
            f"({target.vocab_size}); was it prepared with another tokenizer?"
        )
    store_dtype = str(STORE_DTYPE).removeprefix("torch.")
    fingerprint = extraction_fingerprint(target_dir=target_dir, prepared_dir=prepared_dir, layer_ids=layer_ids,
                                         dtype=store_dtype, num_rows=num_rows)
    dev, where = place_target(num_gpus, device)
    budget = batch_token_budget(dev.type, batch_tokens)
    wanted, shard_plan = range(num_rows), None
    if rows is not None:
        shard_plan = plan_forward_batches(lengths, budget)
        if not 0 <= rows.start < rows.stop <= num_rows:
            raise ValueError(f"rows {rows.start}..{rows.stop} are not a span of the {num_rows} prepared rows")
        wanted = [i for batch in shard_plan for i in batch][rows.start:rows.stop]
        fingerprint = shard_fingerprint(fingerprint, rows)
    hs_dir, reused, resumable = resume_or_start(
        out_dir=out_dir, fingerprint=fingerprint, hs_dirname=HIDDEN_STATES_DIRNAME, manifest_name=MANIFEST_NAME,
        input_ids=input_ids, num_layers=len(layer_ids), hidden_size=target.hidden_size)
    kept = set(reused.indices)
    todo = [i for i in wanted if i not in kept]
    total = len(wanted)
    batches = None
    if shard_plan is not None:  # the batches one worker runs, less the rows of other shards and those kept
        left = set(todo)
        batches = [kept_rows for batch in shard_plan if (kept_rows := [i for i in batch if i in left])]
    if resumable:
        log.info("resuming %s: %d of %d samples already written whole are kept, %d incomplete redone",
                 out_dir, len(kept), num_rows, reused.redone)

    threaded = dev.type == "cuda" if overlap is None else bool(overlap)
    split = dict.fromkeys(("model_load", "forward_loop", "forward", "copies", "writes", "write_wait", "drain"), 0.0)
    bytes_on_disk, extracted_tokens, done = reused.nbytes, 0, len(kept)
    step = max(1, total // 100)
    if on_progress is not None and done:
        on_progress(done, total)

    pending: deque = deque()  # (rows, future of (bytes, seconds writing)) per batch handed to the writer, in order

    def settle(block: bool) -> None:
        """Count the batches whose files are written, oldest first (a writer's error is raised here)."""
        nonlocal bytes_on_disk, extracted_tokens, done
        while pending and (block or pending[0][1].done()):
            rows, written = pending.popleft()
            nbytes, seconds = written.result()
            bytes_on_disk += nbytes
            split["writes"] += seconds
            extracted_tokens += sum(len(row) for row in rows)
            prev, done = done, done + len(rows)
            if on_progress is not None and (done // step != prev // step or done == total):
                on_progress(done, total)

    if todo:  # a resumed extraction with nothing left to do never loads the model
        t0 = time.perf_counter()
        model = load_target(target_dir, dev, num_gpus)
        split["model_load"] = time.perf_counter() - t0
        _, layers, _ = decoder_parts(model)
        if len(layers) != target.num_layers:
            raise ValueError(f"{target_dir}: config says {target.num_layers} layers, model has {len(layers)}")
        if threaded and dev.type == "cuda":
            largest = (_largest_batch_tokens(lengths, todo, budget) if batches is None else
                       max(len(b) * max(lengths[i] for i in b) for b in batches))
            capacity = largest * len(layer_ids) * target.hidden_size
            copies = PinnedCopies(dev, capacity, WRITES_IN_FLIGHT, STORE_DTYPE)
        else:
            copies = BlockingCopies(dev)
        forward_times = EventTimes() if dev.type == "cuda" else None
        # closing(): whatever stops the loop takes the hooks off the model; the writer's `with` cancels
        # what is queued and joins its thread, so that no file is written after extract() returned.
        with (
            closing(_forward_batches(model, data, lengths, budget, layer_ids, dev, only=todo,
                                     batches=batches)) as forwarded_batches,
            _writer(threaded) as writer,
        ):
            loop_started = time.perf_counter()
            for forwarded in forwarded_batches:
                if forward_times is not None:
                    forward_times.add(*forwarded.events)
                else:
                    split["forward"] += time.perf_counter() - forwarded.started
                staged = copies.stage(forwarded)
                del forwarded  # the device copy of the states lives on only until the copy has read it
                t0 = time.perf_counter()
                written = writer.submit(_write_staged, hs_dir, staged)
                split["write_wait"] += time.perf_counter() - t0
                written.add_done_callback(lambda _, staged=staged: copies.release(staged))
                pending.append((staged.rows, written))
                del staged, written  # a batch's host memory is held by `pending` alone, until it is settled
                settle(block=False)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # the last forward and copy are part of the loop
            loop_seconds = time.perf_counter() - loop_started
            t0 = time.perf_counter()
            settle(block=True)
            split["drain"] = time.perf_counter() - t0
        split["write_wait"] += copies.wait_seconds
        split["forward_loop"] = loop_seconds - split["write_wait"]
        split["copies"] = copies.copy_seconds()
        if forward_times is not None:
            split["forward"] = forward_times.total()
        del model, layers, copies
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            # Freed pinned buffers stay in torch's host cache, not the system's; the worker's next
            # stage (a training, say) may want that memory. Private in torch 2.x: see torch_internals.
            release_pinned_host_cache()

    if rows is not None:
        log.info("shard rows %d..%d: extracted %d rows (%d kept from an earlier attempt), %d tokens",
                 rows.start, rows.stop, len(todo), len(kept), extracted_tokens)
        return ExtractionShard(
            row_start=rows.start, row_stop=rows.stop, out_dir=str(out_dir), num_samples=total,
            samples_reused=len(kept), tokens_reused=reused.tokens, tokens_extracted=extracted_tokens,
            bytes_on_disk=bytes_on_disk, model_load_seconds=split["model_load"], forward_seconds=split["forward_loop"],
            total_seconds=time.perf_counter() - started, device=where, time_split_s=split)
    result = write_manifest(
        out_dir=out_dir, hs_dir=hs_dir, target_dir=target_dir, prepared_dir=prepared_dir, lengths=lengths,
        layer_ids=layer_ids, hidden_size=target.hidden_size, dtype=store_dtype, tp_size=1, started=started,
        model_load_seconds=split["model_load"], forward_seconds=split["forward_loop"], reused=reused,
        tokens_extracted=extracted_tokens, bytes_on_disk=bytes_on_disk, device=where, time_split=split)
    if result.bytes_per_token > result.floor_bytes_per_token * 1.10:
        log.warning("%.0f bytes per token on disk, floor %d: many tiny rows?", result.bytes_per_token,
                    result.floor_bytes_per_token)
    log.info(
        "extracted %d rows (%d kept from an earlier attempt), %d tokens, layers %s in %.1f s (%.0f tok/s on %s; "
        "seconds: %s)", num_rows - len(kept), len(kept), extracted_tokens, layer_ids, result.total_time_seconds,
        result.tokens_per_second, where, ", ".join(f"{k} {v:.2f}" for k, v in split.items()),
    )
    return result
