"""Which prompts a measurement of acceptance decodes, as the web tier describes them and a worker loads
them (workers.stages.evaluate.prompts.prompts_load, which needs the tokenizer and the datasets library).

The web tier plans a measurement (runs.checkpoints.evaluation) without importing a stage: it reads the
held-out split the train stage recorded (`validation_rows`, plain JSON) and hands the worker a
`PromptSource`; the worker turns it into token ids. No torch, no datasets here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workers.contract.errors import InputError

# |vLLM's τ − ours| beyond this makes a serve check a warning naming both (pages and the check share it).
TAU_WARNING = 0.05


class EvaluationInputError(InputError):
    """The checkpoint, the target or the prompts cannot be evaluated together; the message says why."""


@dataclass(frozen=True)
class PromptSource:
    """A chat file's conversations (`kind` "file": `path` the file, `tokenizer_dir` the target that renders
    them) or a run's held-out prepared rows (`kind` "prepared": `path` the prepared dataset, `row_indices`),
    the first `limit` of them."""

    kind: str
    path: Path
    limit: int
    tokenizer_dir: Path | None = None
    row_indices: tuple[int, ...] = ()


def validation_rows(checkpoints_dir: Path) -> list[int]:
    """Row indices of the held-out conversations the train stage wrote beside its checkpoints (none of
    their rows was trained on)."""
    path = Path(checkpoints_dir) / "split.json"
    try:
        rows = json.loads(path.read_text())["val_rows"]
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise EvaluationInputError(f"{path}: no validation split recorded ({exc}); give a prompts file") from None
    if not rows:
        raise EvaluationInputError(f"{path}: no held-out conversation (every validation row belongs to a conversation "
                                   "the draft trained on); give a prompts file")
    return [int(i) for i in rows]
