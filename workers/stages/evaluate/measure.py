"""Evaluate stage: a draft's acceptance length, measured by real speculative decoding.

The target (transformers, KV cache) and an EAGLE-3 draft decode greedily together
(workers/stages/evaluate/speculative.py: the draft proposes a chain of k tokens, one target forward verifies
them). tau is tokens per verification forward, counting only tokens that reach the output (after
the max_new_tokens and EOS cuts); the prefill forward is not counted. Acceptance at draft position i
is the share of verification forwards whose first i+1 drafted tokens were all emitted, so
tau = 1 + sum(acceptance_per_position).

How the draft is fed mirrors speculators' training forward (`Eagle3DraftModel.forward`,
`eagle3/data.py:shift_batch`, `eagle3/attention.py`), which is also how vLLM runs it:
- context entry j (one per target position): input = [embed(x_{j+1}), fc(norm(aux_j))] with
  aux_j the target's inputs to the aux layers at position j, rotary position j+1; it attends to
  the context entries j' <= j inside the sliding window.
- chain step s >= 1 at the last position m-1: input = [embed(d_s), h_{s-1}] where h_{s-1} is the
  draft's own output hidden state of the previous step (after the output norm when
  `norm_output`), rotary position m+s; it attends to the whole context window and to its own
  earlier chain entries (the diagonal blocks of training's TTT mask).
- draft logits index the draft vocabulary; d2t maps them to target ids.
Greedy output without the draft is decoded by the same target with the same cache, one token
per forward, and compared token for token: a draft may change speed, never the text.
"""
from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from workers.contract.chats.prompt_source import EvaluationInputError  # noqa: E402
from workers.stages.evaluate.speculative import (  # noqa: E402
    Measurement,
    PromptResult,
    eos_ids,
    measure,
)
from workers.stages.evaluate.k_table import KTable, draft_cost_ratio, k_limit, k_probes, k_table_of  # noqa: E402
from workers.contract.acceptance import evaluation_phases, tau_standard_error  # noqa: E402
from workers.contract.target import read_target_config  # noqa: E402
from workers.stages.evaluate.parts import evaluation_part_write  # noqa: E402

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_MAX_PROMPTS = 32


@dataclass(frozen=True)
class EvaluationResult:
    checkpoint_dir: Path
    target_dir: Path
    num_speculative_tokens: int
    max_new_tokens: int
    num_prompts: int
    prompt_source: str
    tau: float
    acceptance_per_position: list[float]
    new_tokens: int
    verify_forwards: int
    output_matches_greedy: bool
    mismatched_prompts: list[int]
    spec_seconds: float
    greedy_seconds: float
    spec_tokens_per_s: float
    greedy_tokens_per_s: float
    speedup: float
    device: str
    seconds: float
    # τ's standard error over the prompts (workers.contract.acceptance.tau_standard_error): the prompts'
    # noise, against which a serve check's figure for the run's best is judged (runs.pipeline.best).
    tau_standard_error: float | None = None
    prompts: list[PromptResult] = field(default_factory=list)
    # The replies token by token, bounded (workers.stages.evaluate.generations); empty where the target's
    # tokenizer could not be loaded to give the tokens' texts.
    generations: dict = field(default_factory=dict)
    # τ and acceptance by position for k = 1..k_max and the k to serve (workers.stages.evaluate.k_table,
    # KTable.as_dict); empty where k_beyond < 0 asked for none.
    k_table: dict = field(default_factory=dict)
    recommended_k: int | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["checkpoint_dir"], d["target_dir"] = str(self.checkpoint_dir), str(self.target_dir)
        return d


# --- models ---------------------------------------------------------------------------------------

def load_draft(checkpoint_dir: Path, target_model, device: torch.device, dtype: torch.dtype):
    """The draft from its speculators checkpoint, attention run eagerly with our own masks."""
    from safetensors import safe_open
    from speculators.models.eagle3 import Eagle3DraftModel

    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / "config.json").exists():
        raise EvaluationInputError(f"{checkpoint_dir}: no config.json; not a speculators checkpoint")
    try:
        draft = Eagle3DraftModel.from_pretrained(str(checkpoint_dir))
    except Exception as exc:  # noqa: BLE001 - speculators' reason is the user's answer
        raise EvaluationInputError(f"{checkpoint_dir}: Eagle3DraftModel.from_pretrained failed: {exc}") from None
    with safe_open(str(checkpoint_dir / "model.safetensors"), "pt") as fh:
        saved = set(fh.keys())
    if "embed_tokens.weight" not in saved:
        # speculators may leave the verifier's embeddings out of the file; vLLM takes them from the target.
        draft.embed_tokens.weight.data.copy_(target_model.get_input_embeddings().weight.data.to(torch.float32))
    for layer in draft.layers:
        layer.self_attn.config._attn_implementation = "eager"  # noqa: SLF001
    return draft.to(device=device, dtype=dtype).eval()


class DraftRunner:
    """The draft's KV cache over context entries, plus the chain entries of the current proposal."""

    def __init__(self, draft):
        from transformers import DynamicCache

        self.draft = draft
        self.cache = DynamicCache()
        self.context = 0  # context entries in the cache
        self.chain = 0  # chain entries after them
        self.window = getattr(draft, "sliding_window", None) if draft.uses_sliding_window_attn else None
        self.d2t = draft.d2t.to(torch.long)

    def _mask(self, query_pos: torch.Tensor, chain_query: bool) -> torch.Tensor:
        kv_len = self.context + self.chain + len(query_pos)
        kv_pos = torch.arange(self.context, device=query_pos.device)
        allowed = kv_pos[None, :] <= query_pos[:, None]
        if self.window is not None:
            allowed &= kv_pos[None, :] > query_pos[:, None] - self.window
        extra = kv_len - self.context
        tail = torch.zeros((len(query_pos), extra), dtype=torch.bool, device=query_pos.device)
        if chain_query:
            tail[:] = True  # its earlier chain entries and itself
        else:
            tail = torch.tril(torch.ones((len(query_pos), extra), dtype=torch.bool, device=query_pos.device))
        allowed = torch.cat([allowed, tail], dim=1)
        mask = torch.zeros(allowed.shape, dtype=self.draft.fc.weight.dtype, device=query_pos.device)
        return mask.masked_fill_(~allowed, float("-inf"))[None, None]

    def _layers(self, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        draft = self.draft
        position_ids = (positions + 1)[None]  # speculators' positions start at 1 after the shift
        position_embeddings = draft.rotary_emb(hidden, position_ids)
        start = self.context + self.chain
        cache_position = torch.arange(start, start + hidden.shape[1], device=hidden.device)
        for layer in draft.layers:
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=self.cache,
                           cache_position=cache_position, position_embeddings=position_embeddings)
        if draft.config.norm_output:
            hidden = draft.norm(hidden)
            logits = draft.lm_head(hidden)
        else:
            logits = draft.lm_head(draft.norm(hidden))
        return hidden, logits

    def to_target(self, logits: torch.Tensor) -> int:
        idx = int(torch.argmax(logits))
        return idx + int(self.d2t[idx])

    def extend(self, aux: torch.Tensor, next_tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Add context entries for the target positions behind `aux` ([n, L*H]); returns their
        output hidden states and draft-vocabulary logits ([1, n, ...])."""
        self.drop_chain()
        draft = self.draft
        device = draft.fc.weight.device  # aux from a target spread over GPUs may lie on another one
        hidden = aux[None].to(device=device, dtype=draft.fc.weight.dtype)
        if draft.input_norm is not None:
            hidden = draft.input_norm(hidden)
        if draft.fc_norm is not None:
            chunks = hidden.chunk(len(draft.fc_norm), dim=-1)
            hidden = torch.cat([norm(c) for norm, c in zip(draft.fc_norm, chunks)], dim=-1)
        hidden = draft.fc(hidden)
        embeds = draft.embed_tokens(torch.tensor([next_tokens], device=device))
        positions = torch.arange(self.context, self.context + len(next_tokens), device=device)
        mask = self._mask(positions, chain_query=False)
        out, logits = self._layers(torch.cat([embeds, hidden], dim=-1), positions, mask)
        self.context += len(next_tokens)
        return out, logits

    def chain_step(self, token: int, hidden: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain step `step` (>= 1) at the last context position, fed `token` and the previous step's
        output hidden state ([1, 1, H])."""
        device = hidden.device
        embeds = self.draft.embed_tokens(torch.tensor([[token]], device=device))
        last = torch.tensor([self.context - 1], device=device)
        mask = self._mask(last, chain_query=True)
        out, logits = self._layers(torch.cat([embeds, hidden], dim=-1), last + step, mask)
        self.chain += 1
        return out, logits

    def drop_chain(self) -> None:
        if self.chain:
            self.cache.crop(-self.chain)
            self.chain = 0


class Eagle3Proposer:
    """The EAGLE-3 draft as speculative_decode's proposer: its context entries follow the confirmed
    positions, and each proposal is a chain from the last one's output hidden state."""

    def __init__(self, draft):
        self.runner = DraftRunner(draft)
        self.hidden: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None

    def extend(self, aux: torch.Tensor, next_tokens: list[int]) -> None:
        self.hidden, self.logits = self.runner.extend(aux, next_tokens)

    def propose(self, k: int) -> list[int]:
        hidden = self.hidden[:, -1:]
        drafts = [self.runner.to_target(self.logits[0, -1])]
        for step in range(1, k):
            hidden, logits = self.runner.chain_step(drafts[-1], hidden, step)
            drafts.append(self.runner.to_target(logits[0, -1]))
        return drafts


def _generations(target_dir: Path, prompts: list[list[int]], results: list[PromptResult], k: int) -> dict:
    """The replies token by token with their texts, or nothing (said in the log) where the target has no
    tokenizer to decode them with: τ was measured all the same."""
    from workers.stages.evaluate.generations import generation_table
    from workers.stages.prepare.render import load_tokenizer

    try:
        tokenizer = load_tokenizer(target_dir)
    except (OSError, ValueError) as exc:
        log.warning("no generations recorded: the tokenizer of %s did not load (%s)", target_dir, exc)
        return {}
    return generation_table(prompts, results, k=k, tokenizer=tokenizer)


def _phase(on_progress: Callable[[int, int], None] | None, index: int, phases: int):
    """Pass `index` of `phases` over the same prompts, reported as one count: the page does not say done
    while the k table's probes, as long again as the measurement, still run."""
    if on_progress is None:
        return None
    return lambda done, of: on_progress(index * of + done, phases * of)


def evaluate(
    *,
    target_dir: Path,
    checkpoint_dir: Path,
    prompts: list[list[int]],
    prompt_source: str,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    num_speculative_tokens: int | None = None,
    device: str = "auto",
    num_gpus: int = 1,
    k_beyond: int = 2,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    rows: range | None = None,
    part_dir: Path | None = None,
):
    """Decode every prompt with and without the draft; tau, acceptance per position, speeds and
    whether the texts are equal; then τ for every k from 1 to the draft's k plus `k_beyond` (the k table,
    workers.stages.evaluate.k_table; none when k_beyond < 0) and the k to serve.

    num_gpus > 1 spreads the target over that many GPUs as the extraction does (load_target,
    device_map); `device` is then ignored, and the draft and the inputs go to cuda:0.

    `on_progress(done, total)` counts every pass over the prompts: the measurement, then the k table's
    probes (workers.contract.acceptance.evaluation_phases), so total is prompts x passes from its first call.

    `rows`: one shard's part (issue 36): only prompts[rows] are decoded (the prompts are the rows, in
    their order), their results written to `part_dir` (the shard's folder), and an EvaluationPart
    returned; workers.stages.evaluate.merge.evaluate_merge computes the result from the parts. Greedy
    decoding has no randomness, so a prompt's result is the same in whichever shard it is."""
    from workers.stages.extract.model import load_target, place_target

    started = time.monotonic()
    target_dir, checkpoint_dir = Path(target_dir), Path(checkpoint_dir)
    if not prompts:
        raise EvaluationInputError("no prompts to evaluate on")
    if max_new_tokens < 1:
        raise EvaluationInputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if rows is not None and (part_dir is None or rows.step != 1 or not 0 <= rows.start < rows.stop <= len(prompts)):
        raise EvaluationInputError(f"rows {rows.start}..{rows.stop} is not a span of the {len(prompts)} prompts "
                                   "(or no part_dir was given for it)")
    dev, where = place_target(num_gpus, device, EvaluationInputError)
    target_cfg = read_target_config(target_dir)
    model = load_target(target_dir, dev, num_gpus)
    dtype = next(model.parameters()).dtype
    draft = load_draft(checkpoint_dir, model, dev, dtype)
    if draft.hidden_size != target_cfg.hidden_size:
        raise EvaluationInputError(
            f"{checkpoint_dir}: draft hidden size {draft.hidden_size}, target {target_dir} has {target_cfg.hidden_size}")
    if draft.t2d is not None and draft.t2d.shape[0] != target_cfg.vocab_size:
        raise EvaluationInputError(
            f"{checkpoint_dir}: t2d covers {draft.t2d.shape[0]} tokens, the target's vocabulary has {target_cfg.vocab_size}")
    aux_ids = list(draft.target_layer_ids)
    if any(not 0 <= i < target_cfg.num_layers for i in aux_ids):
        raise EvaluationInputError(f"{checkpoint_dir}: aux layer ids {aux_ids} are outside the target's 0..{target_cfg.num_layers - 1}")
    proposals = draft.config.speculators_config.proposal_methods
    k = num_speculative_tokens or (proposals[0].speculative_tokens if proposals else 3)
    if not 1 <= k <= 16:
        raise EvaluationInputError(f"num_speculative_tokens must be between 1 and 16, got {k}")
    k_max = k_limit(k, k_beyond) if k_beyond >= 0 else k
    phases = evaluation_phases(k_beyond)
    max_len = getattr(model.config, "max_position_embeddings", None)
    too_long = [i for i, p in enumerate(prompts) if max_len and len(p) + max_new_tokens + max(k, k_max) > max_len]
    if too_long:
        raise EvaluationInputError(
            f"{len(too_long)} prompt(s) (first: #{too_long[0]}, {len(prompts[too_long[0]])} tokens) plus "
            f"{max_new_tokens} new tokens exceed the target's {max_len} positions; lower max_new_tokens")
    shard = prompts if rows is None else prompts[rows.start:rows.stop]
    try:
        # draft is bound as a default, not a closure: it is deleted below
        measured = measure(model, shard, aux_layer_ids=aux_ids, new_proposer=lambda _, d=draft: Eagle3Proposer(d),
                           k=k, max_new_tokens=max_new_tokens, eos=eos_ids(model), device=dev,
                           on_progress=_phase(on_progress, 0, phases), should_stop=should_stop)
        probes, draft_cost = None, draft_cost_ratio(draft, model)
        if k_beyond >= 0:
            probes = k_probes(model, shard, aux_layer_ids=aux_ids, new_proposer=lambda _, d=draft: Eagle3Proposer(d),
                              k_max=k_max, max_new_tokens=max_new_tokens, eos=eos_ids(model), device=dev,
                              on_progress=_phase(on_progress, 1, phases), should_stop=should_stop)
    finally:
        # A target spread by accelerate holds itself in a reference cycle (its wrapped forwards), so it
        # is freed only by the collector; a run's stage then loads it again for its next checkpoint.
        del model, draft
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if rows is not None:
        return evaluation_part_write(part_dir=Path(part_dir), rows=rows, k=k, max_new_tokens=max_new_tokens,
                                     checkpoint_dir=checkpoint_dir, measured=measured, device=where,
                                     seconds=time.monotonic() - started,
                                     k_probes={"k_max": k_max, "draft_cost": draft_cost, "probes": probes}
                                     if probes is not None else None)
    table = k_table_of(probes, k_max=k_max, draft_cost=draft_cost) if probes is not None else None
    return evaluation_result(target_dir=target_dir, checkpoint_dir=checkpoint_dir, k=k, max_new_tokens=max_new_tokens,
                             prompts=prompts, prompt_source=prompt_source, measured=measured, table=table,
                             device=where, seconds=time.monotonic() - started)


def evaluation_result(*, target_dir: Path, checkpoint_dir: Path, k: int, max_new_tokens: int,
                      prompts: list[list[int]], prompt_source: str, measured: Measurement, table: KTable | None,
                      device: str, seconds: float) -> EvaluationResult:
    """The stage's result from a measurement over every prompt (one worker's, or the shards' together)."""
    generations = _generations(target_dir, prompts, measured.prompts, k)
    new_tokens, spec_s, greedy_s = measured.new_tokens, measured.spec_seconds, measured.greedy_seconds
    tau, per_position, mismatched = measured.tau, measured.acceptance_per_position, measured.mismatched_prompts
    result = EvaluationResult(
        checkpoint_dir=checkpoint_dir, target_dir=target_dir, num_speculative_tokens=k,
        max_new_tokens=max_new_tokens, num_prompts=len(measured.prompts), prompt_source=prompt_source,
        tau=tau, acceptance_per_position=per_position, new_tokens=new_tokens, verify_forwards=measured.verify_forwards,
        output_matches_greedy=not mismatched, mismatched_prompts=mismatched,
        spec_seconds=spec_s, greedy_seconds=greedy_s,
        spec_tokens_per_s=new_tokens / spec_s if spec_s else 0.0,
        greedy_tokens_per_s=new_tokens / greedy_s if greedy_s else 0.0,
        speedup=greedy_s / spec_s if spec_s else 0.0,
        device=device, seconds=seconds, prompts=measured.prompts, generations=generations,
        tau_standard_error=tau_standard_error([p.accepted for p in measured.prompts]),
        k_table=table.as_dict() if table else {}, recommended_k=table.recommended_k if table else None,
    )
    log.info("evaluated %s on %d prompts: tau %.3f (k=%d), acceptance %s, %s greedy output",
             checkpoint_dir, len(measured.prompts), tau, k, [round(p, 3) for p in per_position],
             "same" if not mismatched else f"DIFFERENT on {len(mismatched)} prompt(s) from")
    return result
