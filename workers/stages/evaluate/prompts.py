"""What the evaluate stage decodes from: a run's held-out conversations, or a chat file's, each cut
at its first reply (workers/stages/evaluate/measure.py measures the draft on them). No torch here."""
from __future__ import annotations

from pathlib import Path

# Planned by the web tier, which may import only the contract: the error and the prompt source live there.
from workers.contract.chats.prompt_source import EvaluationInputError, PromptSource


def prompts_load(source: PromptSource) -> list[list[int]]:
    """The token ids of the prompts a measurement's plan (runs.checkpoints.evaluation) describes."""
    if source.kind == "file":
        return prompts_from_file(source.path, source.tokenizer_dir, limit=source.limit)
    if source.kind == "prepared":
        return prompts_from_prepared(source.path, list(source.row_indices), limit=source.limit)
    raise EvaluationInputError(f"unknown prompt source {source.kind!r}")


def prompts_from_prepared(prepared_dir: Path, row_indices: list[int], *, limit: int) -> list[list[int]]:
    """The context of each held-out conversation's first reply: a prepared row cut at its first
    supervised token (workers.stages.train.holdout.prompt_keys, whose keys kept every such context out of
    training). One prompt per conversation, in split order."""
    from datasets import load_from_disk

    from workers.stages.train.holdout.prompt_keys import prompt_context

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
    from workers.stages.prepare.render import load_tokenizer
    from workers.contract.chats.jsonl import read_conversations

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

