"""The shard seam (workers.orchestration.shard_runners) for prepare, regenerate and evaluate (issue 36): each turns its
row into plain paths and calls the Django-free stage functions' `rows=` part and merge, whose outputs are
one worker's byte for byte (docs/concepts/shard-stages.md).

Evaluation: one evaluation measures several checkpoints on several suites, then the run's best on its
held-out prompts (workers.orchestration.stage_runners._evaluate). Its rows are every measurement's prompts one after the
other, in the order one worker measures them, so a shard's span may cross measurements: it decodes its
share of each it touches, a part per measurement, and the merge computes each measurement from its parts
(workers.stages.evaluate.merge, the code one worker's evaluate() ends with) and records them as one worker does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from eagle3web.db import db_retry
from runs.checkpoints.evaluation import evaluation_plan
from runs.data.curation import dataset_exclusions
from runs.pipeline.lifecycle.result_records import measured_alongside_record
from runs.pipeline.dispatch.routing import stage_backend
from workers.orchestration.stage_runners import _backend, _fresh_dir, _target_dir
from workers.stages.shards import shard_dir


# -- prepare --------------------------------------------------------------------------------------------

def prepare_parts_dir(record) -> Path:
    """Beside the prepared folder, not in it: the merge writes that folder, which must start empty."""
    return Path(record.run.output_dir) / "prepare_parts"


def _prepare_common(record) -> dict:
    run = record.run
    return dict(dataset_path=Path(run.dataset.path), max_seq_len=run.config["max_seq_len"],
                max_samples=run.config.get("max_samples"))


def prepare_rows(record) -> int:
    from workers.stages.prepare.merge import prepare_count_rows

    return prepare_count_rows(Path(record.run.dataset.path))


def prepare_shard(record, reporter, index: int, rows: range) -> dict:
    from workers.stages.prepare.merge import prepare_shard as prepare_part

    excluded = dataset_exclusions(dataset=record.run.dataset)
    part = prepare_part(tokenizer_dir=_target_dir(record.run), **_prepare_common(record),
                   out_dir=_fresh_dir(shard_dir(prepare_parts_dir(record), index)),  # a lost attempt's part goes
                   exclude_ids=excluded.ids, exclude_hashes=excluded.hashes, exclude_own_ids=excluded.own_ids,
                   on_progress=reporter.progress, rows=rows)
    return part.as_dict()


def prepare_merge_shards(record, shards: list, reporter):
    from workers.stages.prepare.merge import prepare_merge

    return prepare_merge(part_dirs=[shard_dir(prepare_parts_dir(record), s.index) for s in shards],
                         out_dir=_fresh_dir(Path(record.run.output_dir) / "prepared"), **_prepare_common(record),
                         total_rows=shards[-1].row_stop)


# -- regenerate (a job) -----------------------------------------------------------------------------------

def _regenerate_dir(record) -> Path:
    return Path(settings.EAGLE3WEB_RUNS_DIR) / "regenerations" / str(record.pk)


def regenerate_parts_dir(record) -> Path:
    return shard_dir(_regenerate_dir(record), 0).parent


def _regenerate_common(record) -> tuple:
    from runs.data.regeneration import regeneration_plan
    from workers.stages.regenerate.base import RegenerateSettings

    plan = regeneration_plan(job=record)
    return plan, dict(settings=RegenerateSettings(max_new_tokens=record.max_new_tokens, temperature=record.temperature,
                                                  seed=record.seed, max_samples=record.max_samples),
                      exclude_ids=plan.exclude_ids, exclude_hashes=plan.exclude_hashes,
                      exclude_own_ids=plan.exclude_own_ids)


def regenerate_rows(record) -> int:
    from workers.stages.regenerate.stage import regenerate_count_rows

    plan, common = _regenerate_common(record)
    return regenerate_count_rows(source_path=plan.source_path, **common)


def regenerate_shard(record, reporter, index: int, rows: range) -> dict:
    from workers.contract.host.backends import vllm_executable
    from workers.stages.regenerate.stage import regenerate

    plan, common = _regenerate_common(record)
    if record.backend == "transformers":  # jobs skip torch's thread setting; this one runs a model here
        import torch

        torch.set_num_threads(settings.EAGLE3WEB_TORCH_THREADS)
    folder = shard_dir(_regenerate_dir(record), index)
    # The same path on every attempt: a shard sent again resumes what its lost attempt wrote.
    return regenerate(target_dir=plan.target_dir, source_path=plan.source_path, out_path=folder / plan.output_path.name,
                      backend=record.backend, **common,
                      vllm_executable=vllm_executable() if record.backend == "vllm" else None,
                      tensor_parallel_size=record.tensor_parallel_size, work_dir=folder,
                      on_progress=reporter.progress, should_stop=reporter.cancelled, rows=rows).as_dict()


def regenerate_merge_shards(record, shards: list, reporter):
    from runs.data.regeneration import regeneration_plan
    from workers.stages.regenerate.merge import regenerate_merge

    return regenerate_merge(parts=[s.result for s in shards], out_path=regeneration_plan(job=record).output_path)


# -- evaluate ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    checkpoint_id: int | None  # None: the evaluation's own (returned to its recorder); else recorded alongside
    checkpoint_dir: Path
    prompts: list
    source: str
    prompts_path: str | None = None
    suite: str = ""


def _measurements(record, plan) -> list[Measurement]:
    """In the order one worker measures them (workers.orchestration.stage_runners._evaluate)."""
    from workers.stages.evaluate.prompts import prompts_load

    held_out = prompts_load(plan.prompts)
    out = []
    for name, source in plan.suites.items():
        prompts, path = prompts_load(source), str(source.path)
        out += [Measurement(cid, cdir, prompts, f"evaluation suite {name} ({path})", path, name)
                for cid, cdir in plan.suite_checkpoints]
    out += [Measurement(cid, cdir, held_out, plan.prompt_source) for cid, cdir in plan.also]
    return out + [Measurement(None, plan.checkpoint_dir, held_out, plan.prompt_source)]


def _spans(measurements: list[Measurement], rows: range) -> list[tuple[int, range]]:
    """(measurement index, its prompts) that the shard's span of all measurements' prompts covers."""
    spans, offset = [], 0
    for at, m in enumerate(measurements):
        start, stop = max(rows.start, offset), min(rows.stop, offset + len(m.prompts))
        if start < stop:
            spans.append((at, range(start - offset, stop - offset)))
        offset += len(m.prompts)
    return spans


def _evaluation_dir(record) -> Path:
    return Path(settings.EAGLE3WEB_RUNS_DIR) / "evaluations" / str(record.pk)


def evaluate_parts_dir(record) -> Path:
    return shard_dir(_evaluation_dir(record), 0).parent


def _part_dir(record, shard_index: int, measurement: int) -> Path:
    return shard_dir(_evaluation_dir(record), shard_index) / f"{measurement:03d}"


def evaluate_rows(record) -> int:
    return sum(len(m.prompts) for m in _measurements(record, evaluation_plan(evaluation=record)))


def _num_gpus(record) -> int:
    if record.run_id is None:
        return 1
    _, gpus = stage_backend(stage_name="evaluate", config=record.run.config or {})
    if gpus != 1:
        _backend(record.run, "evaluate")  # refused, naming why, on a worker that cannot spread it
    return gpus


def evaluate_shard(record, reporter, index: int, rows: range) -> dict:
    from workers.stages.evaluate.measure import evaluate

    plan = evaluation_plan(evaluation=record)
    measurements, done = _measurements(record, plan), 0
    parts = []
    for at, span in _spans(measurements, rows):
        m, start = measurements[at], done
        part = evaluate(target_dir=plan.target_dir, checkpoint_dir=m.checkpoint_dir, prompts=m.prompts,
                        prompt_source=m.source, max_new_tokens=record.max_new_tokens,
                        num_speculative_tokens=record.num_speculative_tokens, num_gpus=_num_gpus(record),
                        k_beyond=settings.EAGLE3WEB_K_BEYOND_TRAINED, should_stop=reporter.cancelled,
                        on_progress=lambda n, _of: reporter.progress(start + n, len(rows)),
                        rows=span, part_dir=_part_dir(record, index, at))
        done += len(span)
        parts.append({"measurement": at, **part.as_dict()})
    return {"measurements": parts}


def evaluate_merge_shards(record, shards: list, reporter):
    from workers.stages.evaluate.merge import evaluate_merge

    plan = evaluation_plan(evaluation=record)
    measurements = _measurements(record, plan)
    covering: dict[int, list[Path]] = {}
    for shard in shards:
        for at, _ in _spans(measurements, range(shard.row_start, shard.row_stop)):
            covering.setdefault(at, []).append(_part_dir(record, shard.index, at))
    result = None
    for at, m in enumerate(measurements):
        result = evaluate_merge(part_dirs=covering[at], target_dir=plan.target_dir, checkpoint_dir=m.checkpoint_dir,
                                prompts=m.prompts, prompt_source=m.source, max_new_tokens=record.max_new_tokens)
        if m.checkpoint_id is not None:
            db_retry("evaluation", measured_alongside_record, measured=record, checkpoint_id=m.checkpoint_id,
                     result=result, prompts_path=m.prompts_path, suite=m.suite)
    return result  # the evaluation's own, last, as one worker's
