"""The upstream tools' command lines a page prints for a run or a checkpoint: `vllm serve` for a
draft, `speculators train` for a run's linked data folder. Reads only (the database, and the small
config files the commands depend on)."""
from __future__ import annotations

from pathlib import Path

from runs.checkpoints.k_selectors import checkpoint_recommended_k
from runs.checkpoints.models import Checkpoint
from runs.data.models import Extraction
from runs.pipeline.models import PipelineRun, VocabMapping
from runs.pipeline.lifecycle.stage_record import StageStatus
from workers.contract.errors import InputError
from workers.contract.extraction.speculators_layout import default_data_dir, speculators_train_command


def recorded_speculative_tokens(checkpoint_dir: Path) -> int | None:
    """How many tokens the draft proposes per step, as its config.json says; None when that file is
    missing or unreadable. Read once, when a checkpoint is registered, into Checkpoint.speculative_tokens."""
    from workers.contract.checkpoints.serving import checkpoint_speculative_tokens

    try:
        return checkpoint_speculative_tokens(Path(checkpoint_dir))
    except InputError:
        return None


def checkpoint_serve_command(checkpoint: Checkpoint, *, verifier: str | None = None) -> str:
    """`vllm serve` for this draft: its target (the run's, or the local copy an import recorded) with
    the draft in --speculative-config, proposing the k its newest measurement recommends, else as many tokens
    as its config.json said when it was registered (read again only if it could not be read then)."""
    from workers.contract.checkpoints.serving import DEFAULT_SPECULATIVE_TOKENS, checkpoint_recorded_verifier, vllm_serve_command

    if verifier is None:
        if checkpoint.verifier_path:
            verifier = checkpoint.verifier_path
        elif checkpoint.training_run_id is not None:
            verifier = checkpoint.training_run.run.target.path
        else:  # imported with no local copy recorded: what its config names, else a word to replace
            verifier = checkpoint_recorded_verifier(Path(checkpoint.path)) or "TARGET_MODEL_DIR"
    # The k its newest measurement recommends (runs.checkpoints.k_selectors); before any, the draft's own; the
    # directory moved or its config is unreadable: the default stands.
    k = (checkpoint_recommended_k(checkpoint) or checkpoint.speculative_tokens
         or recorded_speculative_tokens(Path(checkpoint.path)) or DEFAULT_SPECULATIVE_TOKENS)
    return vllm_serve_command(verifier=verifier, checkpoint_dir=checkpoint.path, num_speculative_tokens=k)


def with_serve_commands(checkpoints, *, verifier: str) -> list[Checkpoint]:
    """The run's checkpoints, each with `serve_command` (their target is the run's)."""
    checkpoints = list(checkpoints)
    for checkpoint in checkpoints:
        checkpoint.recommended_k = checkpoint_recommended_k(checkpoint)  # the page shows it beside the command
        checkpoint.serve_command = checkpoint_serve_command(checkpoint, verifier=checkpoint.verifier_path or verifier)
    return checkpoints


def run_speculators_train_command(*, run: PipelineRun, vocab: VocabMapping, extraction: Extraction | None) -> str | None:
    """How speculators' own CLI trains from this run's linked folder, once the vocab stage made it."""
    data_dir = default_data_dir(Path(run.output_dir))
    if vocab.status != StageStatus.SUCCEEDED or extraction is None or not data_dir.is_dir():
        return None
    return speculators_train_command(target_dir=Path(run.target.path), data_dir=data_dir,
                                     draft_vocab_size=vocab.draft_vocab_size, aux_layer_ids=extraction.layer_ids[:-1])
