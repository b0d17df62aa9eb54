"""The stages that split into shards (issue 36) and, for each, what the shard framework
(workers.orchestration.shard_tasks) asks of it. The seam, for a stage joining SHARDABLE:

- `rows(record) -> int`: how many rows the stage will do, counted cheaply (no model load); the
  planner splits them (with the run's `shards`, or workers.stages.shards.shards_default).
- `spans(record, shards) -> list[range]`: the shards' spans; workers.stages.shards.spans_split unless
  the stage needs its own edges (Transformers extraction: its forward batches').
- `run(record, reporter, index, rows) -> dict`: do one shard's rows (a range of those row numbers) into
  the shard's folder (workers.stages.shards.shard_dir of the stage's folder), with `reporter.progress`
  and `reporter.cancelled` as any stage's callbacks; return a JSON-able dict (the shard row's `result`).
- `merge(record, shards, reporter) -> result`: given every shard row (all succeeded, in index order, each
  with its `result`), put the parts together and return what the stage's recorder takes
  (workers.orchestration.stage_runners.RECORDERS), exactly as one worker's run would have returned it.
- `applies(record) -> bool`: False where this run's stage cannot split (an online run's extraction).
- `batch_tokens(record) -> int | None`: for a stage whose rows share forwards (Transformers extraction), the
  budget its spans are cut with; stored on every shard row and handed to `run` as `batch_tokens=`, so that a
  shard on a host whose own default differs (a GPU's beside a CPU's) still runs the batches one worker runs.
- `parts(record) -> Path`: the folder of the shards' parts where the merge leaves them (prepare's, the
  evaluation's, the regeneration's; the extraction's merge moves its parts' files out and removes it itself).
  Removed once the merged result is recorded, not before: a merge or a recording that fails keeps every
  part for Retry to merge again.

prepare, regenerate (a job: its row's `shards`) and evaluate are in workers.orchestration.shard_stage_runners.
Each runner turns the row into plain paths and calls Django-free stage functions, as workers.orchestration.stage_runners
do.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from django.conf import settings

from runs.pipeline.online import selectors as online_run
from workers.orchestration import shard_stage_runners as stage_runners
from workers.orchestration.stage_runners import _backend, _target_dir
from workers.stages.shards import shard_dir, spans_split


@dataclass(frozen=True)
class Shardable:
    rows: Callable[[object], int]
    run: Callable[[object, object, int, range], dict]
    merge: Callable[[object, list, object], object]
    spans: Callable[[object, int], list[range]] | None = None
    applies: Callable[[object], bool] = lambda record: True
    batch_tokens: Callable[[object], int | None] | None = None
    parts: Callable[[object], Path] | None = None

    def spans_for(self, record, shards: int) -> list[range]:
        return self.spans(record, shards) if self.spans else spans_split(self.rows(record), shards)

    def run_shard(self, record, reporter, index: int, rows: range, batch_tokens: int | None) -> dict:
        if self.batch_tokens is None:
            return self.run(record, reporter, index, rows)
        return self.run(record, reporter, index, rows, batch_tokens=batch_tokens)


def _extraction_dir(record) -> Path:
    return Path(record.run.output_dir) / "extraction"


def _extract_paths(record) -> dict:
    run = record.run
    return dict(target_dir=_target_dir(run), prepared_dir=Path(run.preparation.out_dir), layer_ids=record.layer_ids)


def _extract_batch_tokens() -> int | None:
    return settings.EAGLE3WEB_EXTRACT_BATCH_TOKENS or None


def _extract_device_type() -> str:
    """The device type a Transformers shard on this host extracts on (place_target's "auto": CUDA where
    torch finds a GPU), from the GPUs the worker's start-up probe found, so that planning imports no torch;
    outside a started worker (no probe), torch's own answer."""
    from workers.orchestration.fleet import node_capabilities

    capabilities = node_capabilities()
    if capabilities is None:
        from workers.contract.host.backends import detect_gpus

        return "cuda" if detect_gpus() else "cpu"
    return "cuda" if capabilities.get("gpus") else "cpu"


def _extract_budget(record) -> int | None:
    """The Transformers extraction's padded tokens per forward on this (the planning) host; None for vLLM,
    whose server batches as requests come."""
    from runs.pipeline.dispatch.routing import stage_backend
    from workers.stages.extract.batch_plan import batch_token_budget

    backend, _ = stage_backend(stage_name="extract", config=record.run.config or {})
    return None if backend == "vllm" else batch_token_budget(_extract_device_type(), _extract_batch_tokens())


def _extract_spans(record, shards: int) -> list[range]:
    """Transformers: edges at the forward batches' edges in the order one worker runs them, the shards' padded
    tokens about equal; vLLM: even spans.
    Torch-free (workers.stages.extract.batch_plan): the stage's queue already routed it to a worker able to
    run it, and each shard checks its backend (_backend) before it extracts."""
    from workers.stages.extract.batch_plan import plan_forward_batches, prepared_lengths
    from workers.stages.extract.shards import batch_spans, batch_work

    budget = _extract_budget(record)
    if budget is None:
        return spans_split(record.run.preparation.num_rows, shards)
    lengths = prepared_lengths(Path(record.run.preparation.out_dir))
    batches = plan_forward_batches(lengths, budget)
    # Even in work, not in rows: the longest rows come first, and halving their count gave the first of two
    # shards twice the second's padded tokens (15.7 s against 9.2 s on 1,600 demo rows).
    from workers.contract.target import read_target_config

    hidden = read_target_config(_target_dir(record.run)).hidden_size
    return batch_spans(batches, shards, batch_work(batches, lengths, hidden))


def _extract_shard(record, reporter, index: int, rows: range, batch_tokens: int | None = None) -> dict:
    """`batch_tokens`: the planner's budget stored on the shard row (empty on rows planned before it was
    stored: this host's, as then)."""
    backend, gpus = _backend(record.run, "extract")
    common = dict(**_extract_paths(record), out_dir=shard_dir(_extraction_dir(record), index), rows=rows,
                  on_progress=reporter.progress)
    if backend == "vllm":
        from workers.contract.host.backends import vllm_executable
        from workers.stages.extract.with_vllm import extract_with_vllm

        shard = extract_with_vllm(**common, tensor_parallel_size=gpus, vllm_executable=vllm_executable(),
                                  should_stop=reporter.cancelled)
    else:
        from workers.stages.extract.with_transformers import extract

        shard = extract(**common, num_gpus=gpus, batch_tokens=batch_tokens or _extract_batch_tokens())
    return shard.as_dict()


def _extract_merge(record, shards: list, reporter):
    from workers.contract.target import read_target_config
    from workers.stages.extract.shards import extract_merge
    from workers.stages.extract.batch_plan import open_prepared
    from workers.stages.extract.with_transformers import STORE_DTYPE

    backend, gpus = _backend(record.run, "extract")
    paths = _extract_paths(record)
    _, lengths = open_prepared(paths["prepared_dir"])
    vllm = backend == "vllm"
    return extract_merge(**paths, out_dir=_extraction_dir(record),
                         hidden_size=read_target_config(paths["target_dir"]).hidden_size, lengths=lengths,
                         dtype=str(STORE_DTYPE).removeprefix("torch."), shards=[s.result for s in shards],
                         tp_size=gpus if vllm else 1, extra={"extraction_backend": "vllm"} if vllm else None)


SHARDABLE: dict[str, Shardable] = {
    "prepare": Shardable(rows=stage_runners.prepare_rows, run=stage_runners.prepare_shard,
                         merge=stage_runners.prepare_merge_shards, parts=stage_runners.prepare_parts_dir),
    "extract": Shardable(rows=lambda record: record.run.preparation.num_rows or 0, run=_extract_shard,
                         merge=_extract_merge, spans=_extract_spans, batch_tokens=_extract_budget,
                         applies=lambda record: not online_run.is_online(record.run.config)),
    "regenerate": Shardable(rows=stage_runners.regenerate_rows, run=stage_runners.regenerate_shard,
                            merge=stage_runners.regenerate_merge_shards, parts=stage_runners.regenerate_parts_dir),
    "evaluate": Shardable(rows=stage_runners.evaluate_rows, run=stage_runners.evaluate_shard,
                          merge=stage_runners.evaluate_merge_shards, parts=stage_runners.evaluate_parts_dir),
}
