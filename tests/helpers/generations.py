"""Generations measured for real: the tiny demo target decodes its chat prompts speculatively with the
STAND-IN proposers of tests/stages/evaluate/test_tau_known_answers.py, whose acceptance is known in advance, and
workers.stages.evaluate.generations turns the replies into what a measurement records. Shared by the
recording, API, browser tests and bench/tracker/generations_render.py.

- OracleProposer: proposes the target's own continuation, every draft accepted (τ = k + 1);
- AlwaysWrongProposer: never the target's token, none accepted (τ = 1);
- FirstOnlyProposer: the target's next token, then wrong ones: one accepted per forward (τ = 2)."""
from __future__ import annotations

from dataclasses import dataclass

K = 3
FULL_CHAINS = 5
MAX_NEW = 1 + (K + 1) * FULL_CHAINS  # the prefill's token, then five forwards of k + 1 tokens


def _proposers():
    from tests.stages.evaluate.test_tau_known_answers import AlwaysWrongProposer, OracleProposer

    class FirstOnlyProposer(OracleProposer):
        """STAND-IN draft: the target's next token at position 1, a wrong one after it."""

        def propose(self, k: int) -> list[int]:
            chain = super().propose(k)
            return chain[:1] + [(t + 1) % self.vocab_size for t in chain[1:]]

    return {"oracle": OracleProposer, "wrong": AlwaysWrongProposer, "first": FirstOnlyProposer}


@dataclass(frozen=True)
class Measured:
    prompts: list[list[int]]
    measurement: object  # workers.stages.evaluate.speculative.Measurement
    table: dict  # workers.stages.evaluate.generations.generation_table


def measured(tiny_target, proposer: str, *, prompts: int = 3, max_new_tokens: int = MAX_NEW,
             eos: set[int] | None = None, k: int = K) -> Measured:
    """The tiny target's replies to its first `prompts` chat prompts, drafted by the named stand-in."""
    import torch

    from workers.contract.target import default_layer_ids
    from workers.stages.evaluate.generations import generation_table
    from workers.stages.evaluate.prompts import prompts_from_file
    from workers.stages.evaluate.speculative import eos_ids, greedy_decode, measure
    from workers.stages.extract.model import load_target
    from workers.stages.prepare.render import load_tokenizer

    model = load_target(tiny_target.target_dir, torch.device("cpu"))
    chat_prompts = prompts_from_file(tiny_target.chats_path, tiny_target.target_dir, limit=prompts)
    references = {tuple(p): greedy_decode(model, p, max_new_tokens=max_new_tokens + k, eos=set()) for p in chat_prompts}
    proposer_class = _proposers()[proposer]
    measurement = measure(model, chat_prompts, aux_layer_ids=default_layer_ids(model.config.num_hidden_layers),
                          new_proposer=lambda p: proposer_class(references[tuple(p)], model.config.vocab_size), k=k,
                          max_new_tokens=max_new_tokens, eos=eos_ids(model) if eos is None else eos)
    table = generation_table(chat_prompts, measurement.prompts, k=k, tokenizer=load_tokenizer(tiny_target.target_dir))
    return Measured(chat_prompts, measurement, table)


def result_of(*, checkpoint, found: Measured):
    """What the evaluate stage's worker hands over for `checkpoint` (an EvaluationResult)."""
    from pathlib import Path

    from tests.services.checkpoints.test_best_by_tau import _made
    from workers.stages.evaluate.measure import EvaluationResult

    m = found.measurement
    return _made(EvaluationResult, checkpoint_dir=Path(checkpoint.path), target_dir=Path("/target"),
                 num_speculative_tokens=K, max_new_tokens=MAX_NEW, num_prompts=len(m.prompts),
                 prompt_source="chat prompts", tau=m.tau, acceptance_per_position=m.acceptance_per_position,
                 new_tokens=m.new_tokens, verify_forwards=m.verify_forwards,
                 output_matches_greedy=not m.mismatched_prompts, mismatched_prompts=m.mismatched_prompts,
                 prompts=m.prompts, generations=found.table, device="cpu")


def record(*, stage, checkpoint, found: Measured):
    """The measurement recorded as the evaluate stage records one of its run's checkpoints beside its own
    row `stage` (runs.pipeline.lifecycle.result_records.measured_alongside_record)."""
    from runs.pipeline.lifecycle.result_records import measured_alongside_record

    return measured_alongside_record(measured=stage, checkpoint_id=checkpoint.pk,
                                     result=result_of(checkpoint=checkpoint, found=found))
