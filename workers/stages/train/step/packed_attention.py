"""Attention over a packed training step without the T x ttt*T score matrix.

EAGLE-3's test-time training (TTT) step s attends, for the query at position q, to the keys of
q's own document up to q in the first block (causal, within the sliding window) and to the key at
q alone in each of the s later blocks (the draft's own earlier guesses at q). speculators 0.9
writes that as one mask (speculators.models.eagle3.attention.create_combined_mask_mod) and runs it
two ways: flex attention with a block mask (block-sparse, compiled, on CUDA) or a dense float mask
of T x (s+1)T scores per head ("eager"; memory quadratic in the step's tokens: the whole of an H200
for an 80M-parameter draft at 8,192 tokens per step).

This module registers one attention function, ATTENTION_IMPLEMENTATION, that computes that same
pattern two ways, chosen by the mask it is given:
- a flex `BlockMask` (the CUDA path): speculators' own mask, run by a compiled flex_attention;
- a `DocumentLayout` (the CPU twin): flex attention has no backward on the CPU, so each document's
  scores (L x L) are computed with the diagonal scores of the later blocks (L x s) beside them and
  one softmax over both. Memory is the sum of L^2 over the step's documents: linear in the step for
  documents of bounded length, never T^2.
Padding tokens (document id -1) attend only to themselves in every block, as the flex mask says.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_utils import AttentionInterface

from speculators.models.eagle3.attention import create_combined_mask_mod
from workers.stages.torch_internals import flex_attention_api, raise_recompile_limit

BlockMask, create_block_mask, flex_attention = flex_attention_api()

ATTENTION_IMPLEMENTATION = "eagle3web_packed"


@dataclass(frozen=True)
class DocumentLayout:
    """Where each document of a packed step lies: [start, end) spans in order; positions in no span
    are padding."""

    spans: tuple[tuple[int, int], ...]
    total_len: int
    sliding_window: int | None


def document_layout(document_ids: torch.Tensor, sliding_window: int | None) -> DocumentLayout:
    """Spans of equal, non-negative document ids in a [T] or [1, T] tensor."""
    ids = document_ids.reshape(-1).cpu()
    total = int(ids.shape[0])
    change = torch.nonzero(ids[1:] != ids[:-1]).reshape(-1) + 1
    starts = [0, *change.tolist()]
    ends = [*change.tolist(), total]
    spans = tuple((s, e) for s, e in zip(starts, ends) if int(ids[s]) != -1)
    return DocumentLayout(spans=spans, total_len=total, sliding_window=sliding_window)


def flex_block_mask(document_ids: torch.Tensor, sliding_window: int | None) -> BlockMask:
    """speculators' own mask for the first TTT block; extend_mask_for_draft_tokens adds the rest.
    The step's length must be a multiple of the block size (128), which padded steps are."""
    ids = document_ids.reshape(-1)
    total = int(ids.shape[0])
    mask_mod = create_combined_mask_mod(ids, total, sliding_window=sliding_window)
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=total, KV_LEN=total, device=ids.device)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def document_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: DocumentLayout,
                       scale: float) -> torch.Tensor:
    """[B, H, T, D] queries over [B, Hkv, (s+1)T, D] keys and values -> [B, H, T, D]."""
    total = query.shape[2]
    if layout.total_len != total or key.shape[2] % total:
        raise ValueError(f"queries of {total} tokens against keys of {key.shape[2]}: not whole TTT blocks of "
                         f"a {layout.total_len}-token step")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    later = key.shape[2] // total - 1
    k0, v0 = key[:, :, :total], value[:, :, :total]
    # Each later block's key and value at q itself: [B, H, T, s, D]; its score for q: [B, H, T, s].
    k_diag = key[:, :, total:].unflatten(2, (later, total)).transpose(2, 3)
    v_diag = value[:, :, total:].unflatten(2, (later, total)).transpose(2, 3)
    diag_scores = (query.unsqueeze(3) * k_diag).sum(-1, dtype=torch.float32) * scale
    out = []
    covered = 0
    pieces = list(layout.spans)
    for start, end in pieces:
        if start > covered:  # padding before this document
            out.append(_self_only(query, k0, v0, diag_scores, v_diag, covered, start, scale))
        out.append(_one_document(query, k0, v0, diag_scores, v_diag, start, end, scale, layout.sliding_window))
        covered = end
    if covered < total:
        out.append(_self_only(query, k0, v0, diag_scores, v_diag, covered, total, scale))
    return torch.cat(out, dim=2)


def _one_document(query, k0, v0, diag_scores, v_diag, start, end, scale, window):
    q = query[:, :, start:end]
    scores = torch.matmul(q.float(), k0[:, :, start:end].float().transpose(-1, -2)) * scale  # [B, H, L, L]
    length = end - start
    pos = torch.arange(length, device=q.device)
    allowed = pos.unsqueeze(1) >= pos.unsqueeze(0)
    if window is not None:
        allowed &= pos.unsqueeze(0) > pos.unsqueeze(1) - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(torch.cat([scores, diag_scores[:, :, start:end]], dim=-1), dim=-1)
    own = torch.matmul(probs[..., :length], v0[:, :, start:end].float())
    if diag_scores.shape[-1]:
        own = own + (probs[..., length:].unsqueeze(-1) * v_diag[:, :, start:end].float()).sum(-2)
    return own.to(query.dtype)


def _self_only(query, k0, v0, diag_scores, v_diag, start, end, scale):
    """Padding: each position attends to its own key in every block."""
    q = query[:, :, start:end]
    own_score = (q * k0[:, :, start:end]).sum(-1, keepdim=True, dtype=torch.float32) * scale
    probs = torch.softmax(torch.cat([own_score, diag_scores[:, :, start:end]], dim=-1), dim=-1)
    values = torch.cat([v0[:, :, start:end].unsqueeze(3), v_diag[:, :, start:end]], dim=3).float()
    return (probs.unsqueeze(-1) * values).sum(-2).to(query.dtype)


_compiled_flex = None
# Graphs flex_attention may compile in one process: one per padded length, TTT step (the keys grow
# by a block each) and grad mode (training, validation). Past dynamo's default limit (8) it runs
# flex eagerly, a dense fallback that materialises T x (s+1)T scores per head: on an H200 that took
# 87 GB for an 80M-parameter draft and ran a Kimi-width draft out of memory. So the limit is raised,
# and hitting it fails the step instead of filling the card. The count is per process, and each
# training has a process of its own (workers.stages.train.processes.in_child): a long-lived worker's trainings
# of other shapes never add up to it.
FLEX_RECOMPILE_LIMIT = 256


def compiled_flex_attention():
    """flex_attention compiled once per process: eager flex is a dense fallback (T x (s+1)T scores)."""
    global _compiled_flex
    if _compiled_flex is None:
        raise_recompile_limit(FLEX_RECOMPILE_LIMIT)
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_kwargs):
    """transformers' attention interface: returns ([B, T, H, D], None)."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if isinstance(attention_mask, DocumentLayout):
        out = document_attention(query, key, value, attention_mask, scale)
    elif isinstance(attention_mask, BlockMask):
        out = compiled_flex_attention()(query.contiguous(), key.contiguous(), value.contiguous(),
                                        block_mask=attention_mask, scale=scale,
                                        enable_gqa=query.shape[1] != key.shape[1])
    else:
        raise TypeError(f"{ATTENTION_IMPLEMENTATION} needs a DocumentLayout or a flex BlockMask, "
                        f"got {type(attention_mask).__name__}")
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_IMPLEMENTATION, packed_attention)
