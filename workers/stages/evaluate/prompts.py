"""What the evaluate stage decodes from: a run's held-out conversations, or a chat file's, each cut
at its first reply (workers/stages/evaluate/measure.py measures the draft on them). No torch here."""
from __future__ import annotations

import json
from pathlib import Path

from workers.contract.errors import InputError


class EvaluationInputError(InputError):
    """The checkpoint, the target or the prompts cannot be evaluated together; the message says why."""


def prompts_from_prepared(prepared_dir: Path, row_indices: list[int], *, limit: int) -> list[list[int]]:
    """The context of each held-out conversation's first reply: a prepared row cut at its first
    supervised token (workers.stages.train.prompt_keys, whose keys kept every such context out of
    training). One prompt per conversation, in split order."""
    from datasets import load_from_disk

    from workers.stages.train.prompt_keys import prompt_context

    data = load_from_disk(str(prepared_dir)).with_format(None)
    has_source = "source_id" in data.column_names
    seen, prompts = set(), []
    for i in row_indices:
        row = data[int(i)]
        key = row["source_id"] if has_source else i
        if key in seen:
            continue
        seen.add(key)
        context = prompt_context(row["input_ids"], row["loss_mask"])
        if context:
            prompts.append(context)
        if len(prompts) >= limit:
            break
    return prompts


def prompts_from_file(path: Path, tokenizer_dir: Path, *, limit: int) -> list[list[int]]:
    """Prompts from a chat file in any dataset format: each conversation up to its first reply
    (or whole, when it ends with a user turn), rendered with the generation prompt."""
    from workers.stages.prepare import load_tokenizer, read_conversations

    tokenizer = load_tokenizer(Path(tokenizer_dir))
    prompts = []
    for conv in read_conversations(Path(path)):
        first_reply = next((j for j, t in enumerate(conv.messages) if t["role"] == "assistant" and j > 0), None)
        head = conv.messages[:first_reply] if first_reply is not None else conv.messages
        if not head or head[-1]["role"] == "assistant":
            continue
        out = tokenizer.apply_chat_template(head, tokenize=True, add_generation_prompt=True, return_dict=True)
        prompts.append(list(out["input_ids"]))
        if len(prompts) >= limit:
            break
    if not prompts:
        raise EvaluationInputError(f"{path}: no conversation with a user turn to prompt from")
    return prompts


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
