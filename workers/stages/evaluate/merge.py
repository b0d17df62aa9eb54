"""The merge of a sharded evaluation (issue 36): the shards' parts (workers.stages.evaluate.parts), in
prompt order, give the stage's result with the very sums one worker's evaluate() ends with. Apart from
parts.py so that measure.py (which writes a part) and this (which reads measure's result) import one way.
"""
from __future__ import annotations

from pathlib import Path

from workers.stages.evaluate.k_table import k_table_of
from workers.stages.evaluate.measure import evaluation_result
from workers.stages.evaluate.parts import part_read
from workers.contract.chats.prompt_source import EvaluationInputError
from workers.stages.evaluate.speculative import PromptResult, measurement_of


def _k_settings(part: dict) -> tuple | None:
    probes = part["k_probes"]
    return None if probes is None else (probes["k_max"], probes["draft_cost"])


def evaluate_merge(*, part_dirs: list[Path], target_dir: Path, checkpoint_dir: Path, prompts: list[list[int]],
                   prompt_source: str, max_new_tokens: int):
    """The evaluation's result (measure.EvaluationResult) from the shards' parts, in shard order: τ,
    acceptance by position, counts, mismatches and generations as one worker's evaluate() over `prompts`."""
    parts = [part_read(p) for p in part_dirs]
    if not parts:
        raise EvaluationInputError("no shards to merge")
    expected = 0
    for part_dir, part in zip(part_dirs, parts):
        start, stop = part["rows"]
        if start != expected or len(part["prompts"]) != stop - start:
            raise EvaluationInputError(f"{part_dir} holds prompts {start}..{stop}, but the parts before it end at "
                                       f"{expected}: the parts do not follow each other")
        if (part["checkpoint_dir"], part["max_new_tokens"], part["num_speculative_tokens"], _k_settings(part)) != (
                str(checkpoint_dir), max_new_tokens, parts[0]["num_speculative_tokens"], _k_settings(parts[0])):
            raise EvaluationInputError(f"{part_dir} measured another checkpoint or settings; retry the evaluation")
        expected = stop
    if expected != len(prompts):
        raise EvaluationInputError(f"the parts cover prompts 0..{expected}, not the {len(prompts)} to evaluate")
    k = parts[0]["num_speculative_tokens"]
    results = [PromptResult(**p) for part in parts for p in part["prompts"]]
    for result, prompt in zip(results, prompts):
        if result.prompt_tokens != len(prompt):
            raise EvaluationInputError("the parts measured other prompts than these (a prompt's length differs); "
                                       "retry the evaluation")
    measured = measurement_of(results, k=k, spec_seconds=sum(p["spec_seconds"] for p in parts),
                              greedy_seconds=sum(p["greedy_seconds"] for p in parts))
    table = None
    if parts[0]["k_probes"] is not None:
        k_max, draft_cost = _k_settings(parts[0])
        table = k_table_of([(emitted, lengths) for part in parts for emitted, lengths in part["k_probes"]["probes"]],
                           k_max=k_max, draft_cost=draft_cost)
    return evaluation_result(target_dir=Path(target_dir), checkpoint_dir=Path(checkpoint_dir), k=k,
                             max_new_tokens=max_new_tokens, prompts=prompts, prompt_source=prompt_source,
                             measured=measured, table=table, device=", ".join(sorted({p["device"] for p in parts})),
                             seconds=max(p["seconds"] for p in parts))
