"""What the acceptance benchmarks share: the demo's draft trained as a run trains it (prepare ->
extract -> vocab -> train with a RunConfig), and the held-out prompts its τ is measured on."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runs.pipeline.launch.run_config import RunConfig
from workers.stages.evaluate.prompts import prompts_from_prepared
from workers.contract.chats.prompt_source import validation_rows
from workers.stages.extract.with_transformers import extract
from workers.stages.prepare.stage import prepare
from workers.contract.target import default_layer_ids, read_target_config
from workers.stages.train.results import TrainResult
from workers.stages.train.loop import train
from workers.stages.vocab import VocabResult, build_vocab


@dataclass(frozen=True)
class DemoDraft:
    run_dir: Path
    layer_ids: list[int]
    draft_vocab_size: int
    vocab: VocabResult
    trained: TrainResult
    best_dir: Path
    prompts: list[list[int]]  # first-reply contexts of conversations no training row came from


def train_demo_draft(*, target_dir: Path, chats_path: Path, run_dir: Path, config: RunConfig) -> DemoDraft:
    target = read_target_config(target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    prep = prepare(tokenizer_dir=target_dir, dataset_path=chats_path, out_dir=run_dir / "prepared",
                   max_seq_len=config.max_seq_len)
    ext = extract(target_dir=target_dir, prepared_dir=prep.out_dir, out_dir=run_dir / "extraction", layer_ids=layer_ids)
    draft_vocab = min(config.draft_vocab_size, target.vocab_size)
    vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=run_dir / "vocab",
                        draft_vocab_size=draft_vocab, target_vocab_size=target.vocab_size)
    trained = train(target_dir=target_dir, prepared_dir=prep.out_dir, hidden_states_dir=ext.hidden_states_dir,
                    d2t_path=vocab.d2t_path, t2d_path=vocab.t2d_path, out_dir=run_dir / "checkpoints",
                    layer_ids=layer_ids, epochs=config.epochs, lr=config.lr, ttt_steps=config.ttt_steps,
                    draft_vocab_size=draft_vocab, val_fraction=config.val_fraction, seed=config.seed,
                    max_tokens_per_step=config.max_tokens_per_step)
    best = next(c for c in trained.checkpoints if c.is_best)
    prompts = prompts_from_prepared(prep.out_dir, validation_rows(run_dir / "checkpoints"), limit=config.eval_prompts)
    return DemoDraft(run_dir=run_dir, layer_ids=layer_ids, draft_vocab_size=draft_vocab, vocab=vocab, trained=trained,
                     best_dir=Path(best.path), prompts=prompts)
