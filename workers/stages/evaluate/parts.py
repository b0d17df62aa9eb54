"""A sharded evaluation (issue 36): each shard decodes a span of the prompts and writes its prompts'
results to its folder; the merge puts them in prompt order and computes τ, acceptance by position and
the rest with the very sums one worker's measure() does (speculative.measurement_of), and the k table
from every prompt's probe (k_table.k_table_of).

τ pools every verification forward over every prompt, so it is computed from the prompts' accepted
counts after the merge, never averaged over shards. The timings are sums of the shards' decoding
seconds (so tokens/s is per worker, as one worker's is), and `seconds` is the longest shard's, the
wall time of shards that ran at the same time.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from workers.stages.evaluate.k_table import k_table_of
from workers.stages.evaluate.prompts import EvaluationInputError
from workers.stages.evaluate.speculative import Measurement, PromptResult, measurement_of

PART_NAME = "evaluation_part.json"


@dataclass(frozen=True)
class EvaluationPart:
    part_path: Path
    rows: tuple[int, int]  # [start, stop) of the prompts
    num_speculative_tokens: int
    seconds: float

    def as_dict(self) -> dict:
        """JSON-able (a shard row's result)."""
        d = asdict(self)
        d["part_path"] = str(d["part_path"])
        d["rows"] = list(self.rows)
        return d


def evaluation_part_write(*, part_dir: Path, rows: range, k: int, max_new_tokens: int, checkpoint_dir: Path,
                          measured: Measurement, device: str, seconds: float,
                          k_probes: dict | None) -> EvaluationPart:
    """The shard's prompts' results in part_dir, written aside and renamed (a part is whole or absent);
    `k_probes`: {"k_max", "draft_cost", "probes"} of its prompts for the k table, or None (none asked)."""
    part_dir.mkdir(parents=True, exist_ok=True)
    path = part_dir / PART_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({
        "rows": [rows.start, rows.stop], "num_speculative_tokens": k, "max_new_tokens": max_new_tokens,
        "checkpoint_dir": str(checkpoint_dir), "device": device, "seconds": seconds,
        "spec_seconds": measured.spec_seconds, "greedy_seconds": measured.greedy_seconds,
        "k_probes": k_probes, "prompts": [asdict(p) for p in measured.prompts]}) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return EvaluationPart(part_path=path, rows=(rows.start, rows.stop), num_speculative_tokens=k, seconds=seconds)


def _read(part_dir: Path) -> dict:
    try:
        return json.loads((Path(part_dir) / PART_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise EvaluationInputError(f"{part_dir}: a shard's part is missing or unfinished; retry the shards that "
                                   "did not finish") from None


def _k_settings(part: dict) -> tuple | None:
    probes = part["k_probes"]
    return None if probes is None else (probes["k_max"], probes["draft_cost"])


def evaluate_merge(*, part_dirs: list[Path], target_dir: Path, checkpoint_dir: Path, prompts: list[list[int]],
                   prompt_source: str, max_new_tokens: int):
    """The evaluation's result (measure.EvaluationResult) from the shards' parts, in shard order: τ,
    acceptance by position, counts, mismatches and generations as one worker's evaluate() over `prompts`."""
    from workers.stages.evaluate.measure import evaluation_result

    parts = [_read(p) for p in part_dirs]
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
