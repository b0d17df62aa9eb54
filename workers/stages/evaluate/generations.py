"""The replies a measurement decoded, token by token, for the checkpoint page's generations table
(runs.checkpoints.generation_services stores them; GET /api/v1/checkpoints/<id>/generations/ serves them).

Bounded so that a measurement's row stays small whatever it was asked for (up to 1,000 prompts of 4,096
new tokens): the first MAX_PROMPTS prompts, the first MAX_TOKENS tokens of each reply (a prompt's τ still
counts its whole reply), and the last PROMPT_TAIL_TOKENS tokens of each prompt as text. Stored column by
column (a list per field, one entry per token) rather than an object per token: a third of the size."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from workers.contract.acceptance import tau_from_accepted

if TYPE_CHECKING:  # speculative imports torch; this module only reads its dataclass
    from workers.stages.evaluate.speculative import PromptResult

MAX_PROMPTS = 64
MAX_TOKENS = 256
PROMPT_TAIL_TOKENS = 48
# Tokens decoded before a token to find its own text: a tokenizer drops or merges spaces at the start of
# what it decodes (SentencePiece's leading "▁"), so a token decoded alone can lose its space.
_CONTEXT_TOKENS = 6


def prompt_sha256(prompt: Sequence[int]) -> str:
    """What matches one prompt across measurements: the sha256 of its token ids, comma-separated."""
    return hashlib.sha256(",".join(str(int(t)) for t in prompt).encode()).hexdigest()


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's text as it reads inside the reply: what decoding it adds to the few tokens before it."""
    ids = [int(t) for t in ids]
    texts = []
    for i, token in enumerate(ids):
        head = ids[max(0, i - _CONTEXT_TOKENS):i]
        before = tokenizer.decode(head) if head else ""
        after = tokenizer.decode([*head, token])
        # Not a prefix where the token completes a character whose bytes began earlier: its own decoding.
        texts.append(after[len(before):] if after.startswith(before) else tokenizer.decode([token]))
    return texts


def generation_table(prompts: Sequence[Sequence[int]], results: Sequence[PromptResult], *, k: int,
                     tokenizer) -> dict:
    """{"tokens_cap", "prompts_cap", "prompt_tail_tokens", "prompts": [...]}: per prompt (of the first
    MAX_PROMPTS) its length, sha256, tail text, τ and reply, the reply as parallel lists (ids, texts,
    proposed_at, verify_step, rejected_ids, rejected_texts) of its first MAX_TOKENS tokens."""
    rows = []
    for index, (prompt, result) in enumerate(zip(prompts[:MAX_PROMPTS], results[:MAX_PROMPTS])):
        tail = list(prompt[-PROMPT_TAIL_TOKENS:])
        shown = slice(0, MAX_TOKENS)
        rejected = result.rejected[shown]
        rows.append({
            "index": index,
            "prompt_tokens": len(prompt),
            "prompt_sha256": prompt_sha256(prompt),
            "prompt_tail": tokenizer.decode(tail),
            "prompt_cut": len(prompt) > len(tail),
            "tau": tau_from_accepted(result.accepted, k)[0],
            "verify_forwards": result.verify_forwards,
            "new_tokens": result.new_tokens,
            "matches_greedy": result.matches_greedy,
            "tokens_cut": len(result.tokens) > MAX_TOKENS,
            "ids": [int(t) for t in result.tokens[shown]],
            "texts": token_texts(tokenizer, result.tokens[shown]),
            "proposed_at": list(result.proposed_at[shown]),
            "verify_step": list(result.verify_step[shown]),
            "rejected_ids": [None if r is None else int(r) for r in rejected],
            "rejected_texts": [None if r is None else tokenizer.decode([int(r)]) for r in rejected],
        })
    return {"tokens_cap": MAX_TOKENS, "prompts_cap": MAX_PROMPTS, "prompt_tail_tokens": PROMPT_TAIL_TOKENS,
            "num_speculative_tokens": k, "prompts": rows}
