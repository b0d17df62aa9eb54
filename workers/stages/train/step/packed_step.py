"""The draft's forward over one packed step, memory linear in the step's tokens.

`draft_forward` is `speculators.models.eagle3.core.Eagle3DraftModel.forward` (speculators 0.9.0)
line for line, with three changes that the GPU needs and that do not change what is computed:
- attention through workers.stages.train.step.packed_attention (flex block mask on CUDA, compiled; a
  per-document twin on the CPU) instead of a dense T x ttt*T mask;
- the KL loss through a loss function that keeps no fp32 copy of the logits: speculators' fused
  Triton kernel where Triton runs (kept out of dynamo's graph: under torch 2.11 dynamo fails on
  its autotuner, "ListVariable ... already tracked for mutation"), else `chunked_kl_div`;
- one dtype: the token embeddings and the carried hidden state are cast to the compute dtype
  before they are joined, so every TTT step hands attention the same dtype (under autocast the
  fp32 embeddings promoted the join to fp32 in one step and not the next: dynamo recompiled on
  "hidden_states dtype mismatch").
speculators' `Eagle3DraftModel.forward` is wrapped in torch.compile on any host with CUDA, which
recompiles on every new step length; calling the modules here keeps compilation to the attention
kernel and to padded lengths (`padded_length`).
"""
from __future__ import annotations

import torch
from speculators.models.eagle3.attention import extend_mask_for_draft_tokens
from speculators.models.eagle3.metrics import compute_metrics
from transformers import DynamicCache

from workers.stages.train.step.packed_attention import (
    ATTENTION_IMPLEMENTATION,
    document_layout,
    flex_block_mask,
)

FLEX_BLOCK = 128  # flex attention's block: a step's length must be a multiple of it for the TTT extension
KL_CHUNK_ROWS = 1024


def padded_length(tokens: int, budget: int, *, multiple: int = FLEX_BLOCK, buckets: int = 4) -> int:
    """The length a step of `tokens` is padded to: one of `buckets` evenly spaced lengths up to the
    budget (each a multiple of `multiple`), so that a compiled kernel sees a handful of shapes."""
    top = -(-budget // multiple) * multiple
    stride = max(multiple, -(-top // buckets // multiple) * multiple)
    length = -(-max(tokens, 1) // stride) * stride
    return min(max(length, multiple), -(-top // stride) * stride)


class _ChunkedKL(torch.autograd.Function):
    """Per-position KL(softmax(targets) || softmax(logits)), rows in chunks: saves the inputs as they
    are (bf16 on CUDA) and recomputes the softmaxes in backward, one chunk of rows in fp32 at a time."""

    @staticmethod
    def forward(ctx, logits, targets):
        flat_l, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, targets.shape[-1])
        out = torch.empty(flat_l.shape[0], dtype=torch.float32, device=logits.device)
        for i in range(0, flat_l.shape[0], KL_CHUNK_ROWS):
            log_q = torch.log_softmax(flat_l[i:i + KL_CHUNK_ROWS].float(), dim=-1)
            log_p = torch.log_softmax(flat_t[i:i + KL_CHUNK_ROWS].float(), dim=-1)
            out[i:i + KL_CHUNK_ROWS] = (log_p.exp() * (log_p - log_q)).sum(-1)
        ctx.save_for_backward(logits, targets)
        return out.reshape(logits.shape[:-1])

    @staticmethod
    def backward(ctx, grad_out):
        logits, targets = ctx.saved_tensors
        flat_l, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, targets.shape[-1])
        flat_g = grad_out.reshape(-1)
        grad = torch.empty_like(flat_l)
        for i in range(0, flat_l.shape[0], KL_CHUNK_ROWS):
            q = torch.softmax(flat_l[i:i + KL_CHUNK_ROWS].float(), dim=-1)
            p = torch.softmax(flat_t[i:i + KL_CHUNK_ROWS].float(), dim=-1)
            grad[i:i + KL_CHUNK_ROWS] = ((q - p) * flat_g[i:i + KL_CHUNK_ROWS, None].float()).to(grad.dtype)
        return grad.reshape(logits.shape), None


def chunked_kl_div(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """speculators.losses.eager.kl_div_loss's value and gradient without [T, V] fp32 intermediates."""
    return _ChunkedKL.apply(logits, targets)


def fused_kl_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
        from speculators.losses import fused  # noqa: F401
    except ImportError:
        return False
    return True


def kl_loss_config(device: torch.device, implementation: str = "auto") -> tuple[dict, str]:
    """({"kl_div": (fn, 1.0)}, the implementation's name): "fused" (speculators' Triton kernel,
    outside dynamo), "chunked" (ours), or "eager" (speculators' reference, fp32 [T, V] per step)."""
    if implementation == "auto":
        implementation = "fused" if fused_kl_available(device) else "chunked"
    if implementation == "fused":
        from speculators.losses.fused import fused_kl_div_loss
        return {"kl_div": (torch.compiler.disable(fused_kl_div_loss), 1.0)}, "fused"
    if implementation == "chunked":
        return {"kl_div": (chunked_kl_div, 1.0)}, "chunked"
    if implementation == "eager":
        from speculators.losses.eager import kl_div_loss
        return {"kl_div": (kl_div_loss, 1.0)}, "eager"
    raise ValueError(f"loss implementation must be auto, fused, chunked or eager, got {implementation!r}")


class DraftForward(torch.nn.Module):
    """draft_forward as a module's forward, for DistributedDataParallel to wrap: DDP readies its
    gradient all-reduce in its own forward, which draft_forward alone would bypass."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **arguments):
        return draft_forward(self.model, **arguments)


def use_packed_attention(model) -> None:
    """Point the draft's layers at ATTENTION_IMPLEMENTATION (not saved: transformers drops
    _attn_implementation from the config it writes)."""
    model.config.transformer_layer_config._attn_implementation = ATTENTION_IMPLEMENTATION
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = ATTENTION_IMPLEMENTATION


def _masks(model, document_ids: torch.Tensor, attention: str):
    def build(window):
        if attention == "flex":
            return flex_block_mask(document_ids, window)
        return document_layout(document_ids, window)
    full = build(None) if model.uses_full_attn else None
    sliding = build(model.sliding_window) if model.uses_sliding_window_attn else None
    return full, sliding


def draft_forward(model, *, hidden_states, input_ids, document_ids, loss_mask, position_ids,
                  verifier_last_hidden_states, ttt_steps: int, loss_config: dict, attention: str,
                  compute_dtype: torch.dtype = torch.float32, ttt_step_loss_decay: float = 1.0,
                  step_weights: list[float] | None = None):
    """(draft_tokens, loss, metrics) as Eagle3DraftModel.forward returns them; `attention` is
    "flex" (a BlockMask, compiled) or "document" (the twin). `step_weights`: each TTT step's loss weight
    on one rank of several (workers.stages.train.processes.ddp); the metrics keep the unweighted step losses."""
    device = hidden_states.device
    total_seq_len = hidden_states.shape[1]
    past_key_values = DynamicCache()
    full_mask, sliding_mask = _masks(model, document_ids.squeeze(0), attention)

    if model.input_norm is not None:
        hidden_states = model.input_norm(hidden_states)
    if model.fc_norm is not None:
        chunks = hidden_states.chunk(len(model.fc_norm), dim=-1)
        hidden_states = torch.cat([norm(c) for norm, c in zip(model.fc_norm, chunks, strict=True)], dim=-1)
    hidden_states = model.fc(hidden_states)

    original_input_ids = input_ids.detach().clone()
    with torch.no_grad():
        targets = model.verifier_lm_head(model.verifier_norm(verifier_last_hidden_states))
    loss = torch.tensor(0.0, device=device)
    prev_correct = loss_mask.clone()
    metrics = {}
    draft_tokens = []
    for ttt_step in range(ttt_steps):
        with torch.no_grad():
            input_embeds = model.embed_tokens(input_ids)
        cache_position = torch.arange(ttt_step * total_seq_len, (ttt_step + 1) * total_seq_len,
                                      dtype=torch.long, device=device)
        hidden_states = torch.cat([input_embeds.to(compute_dtype), hidden_states.to(compute_dtype)], dim=-1)
        position_embeddings = model.rotary_emb(hidden_states, position_ids)
        for layer_idx, decoder_layer in enumerate(model.layers):
            layer_mask = sliding_mask if layer_idx in model.sliding_window_indices else full_mask
            hidden_states = decoder_layer(hidden_states, attention_mask=layer_mask, position_ids=position_ids,
                                          past_key_values=past_key_values, cache_position=cache_position,
                                          position_embeddings=position_embeddings)
        if model.config.norm_output:
            hidden_states = model.norm(hidden_states)
            logits = model.lm_head(hidden_states)
        else:
            logits = model.lm_head(model.norm(hidden_states))
        s_loss, s_metrics = compute_metrics(logits, targets, loss_mask, prev_correct, ttt_step,
                                           ttt_step_loss_decay, loss_config=loss_config)
        loss = loss + (s_loss if step_weights is None else s_loss * step_weights[ttt_step])
        metrics.update(s_metrics)
        draft_tokens.append(torch.argmax(logits, dim=-1).detach())
        # Teacher forcing, as speculators: the true next tokens, shifted by 1 + ttt_step.
        input_ids = torch.cat([original_input_ids[:, 1 + ttt_step:], original_input_ids.new_zeros(1, 1 + ttt_step)],
                              dim=-1)
        if attention == "flex":
            full_mask = extend_mask_for_draft_tokens(full_mask) if full_mask is not None else None
            sliding_mask = extend_mask_for_draft_tokens(sliding_mask) if sliding_mask is not None else None
        position_ids = position_ids + 1
    metrics["loss_sum"] = loss.detach().clone()
    metrics["loss_total"] = torch.tensor(1.0, device=device)
    return draft_tokens, loss, metrics
