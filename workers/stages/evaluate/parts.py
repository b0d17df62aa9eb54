"""A sharded evaluation (issue 36): each shard decodes a span of the prompts and writes its prompts'
results to its folder; the merge puts them in prompt order and computes τ, acceptance by position and
the rest with the very sums one worker's measure() does (merge.evaluate_merge), and the k table
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

from workers.contract.chats.prompt_source import EvaluationInputError
from workers.stages.evaluate.speculative import Measurement

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


def part_read(part_dir: Path) -> dict:
    try:
        return json.loads((Path(part_dir) / PART_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise EvaluationInputError(f"{part_dir}: a shard's part is missing or unfinished; retry the shards that "
                                   "did not finish") from None
