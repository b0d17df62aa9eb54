"""Benchmark (not a test): acceptance length of the demo's trained draft against an untrained one.

    .venv/bin/python bench/acceptance.py --json

Builds (or reuses, under --work-dir) the demo target and chats exactly as `make demo` does, runs
prepare -> extract -> vocab -> train with the launch form's defaults (RunConfig), then decodes the
held-out validation conversations with the target alone and with each draft, in this one process:
- trained: the run's best checkpoint;
- random: a draft of the same shape, vocabulary mapping and seed, straight from initialisation
  (what the train stage starts from), saved as a speculators checkpoint.
Both see the same prompts, the same target, the same k and max_new_tokens. tau is output tokens per
verification forward (1 + mean accepted draft tokens per forward, counting only tokens the output
keeps after the max_new_tokens and EOS cuts); ratio = tau_trained / tau_random. The prompts are the
first-reply contexts of conversations no training row came from (split.json's val_rows).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runs.run_config import RunConfig  # noqa: E402
from workers.stages.demo_assets import build_demo_assets  # noqa: E402
from workers.stages.evaluate import evaluate, prompts_from_prepared, validation_rows  # noqa: E402
from workers.stages.extract import extract  # noqa: E402
from workers.stages.prepare import prepare  # noqa: E402
from workers.stages.target import default_layer_ids, read_target_config  # noqa: E402
from workers.stages.train import build_draft_model, train  # noqa: E402
from workers.stages.vocab import build_vocab  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = RunConfig()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-acceptance-"))
    started = time.monotonic()
    assets = build_demo_assets(work / "assets")  # make demo's recipe: 2,000 chats, 600 target steps
    target = read_target_config(assets.target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    run_dir = work / f"run-{int(time.time())}"
    prep = prepare(tokenizer_dir=assets.target_dir, dataset_path=assets.chats_path, out_dir=run_dir / "prepared",
                   max_seq_len=config.max_seq_len)
    ext = extract(target_dir=assets.target_dir, prepared_dir=prep.out_dir, out_dir=run_dir / "extraction",
                  layer_ids=layer_ids)
    draft_vocab = min(config.draft_vocab_size, target.vocab_size)
    vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=run_dir / "vocab",
                        draft_vocab_size=draft_vocab, target_vocab_size=target.vocab_size)
    trained = train(target_dir=assets.target_dir, prepared_dir=prep.out_dir, hidden_states_dir=ext.hidden_states_dir,
                    d2t_path=vocab.d2t_path, t2d_path=vocab.t2d_path, out_dir=run_dir / "checkpoints",
                    layer_ids=layer_ids, epochs=config.epochs, lr=config.lr, ttt_steps=config.ttt_steps,
                    draft_vocab_size=draft_vocab, val_fraction=config.val_fraction, seed=config.seed,
                    max_tokens_per_step=config.max_tokens_per_step)
    best = next(c for c in trained.checkpoints if c.is_best)
    random_dir = run_dir / "untrained"
    build_draft_model(target_dir=assets.target_dir, layer_ids=layer_ids, d2t_path=vocab.d2t_path,
                      t2d_path=vocab.t2d_path, draft_vocab_size=draft_vocab, ttt_steps=config.ttt_steps,
                      seed=config.seed).save_pretrained(str(random_dir))

    prompts = prompts_from_prepared(prep.out_dir, validation_rows(run_dir / "checkpoints"), limit=config.eval_prompts)
    common = dict(target_dir=assets.target_dir, prompts=prompts, prompt_source="validation conversations",
                  max_new_tokens=config.eval_max_new_tokens)
    with_trained = evaluate(checkpoint_dir=best.path, **common)
    with_random = evaluate(checkpoint_dir=random_dir, **common)
    from workers.stages.acceptance import cond_accuracies, simulated_tau

    result = {
        "tau_trained": round(with_trained.tau, 4),
        "tau_random": round(with_random.tau, 4),
        "ratio": round(with_trained.tau / with_random.tau, 4),
        "acceptance_per_position": [round(p, 4) for p in with_trained.acceptance_per_position],
        "acceptance_per_position_random": [round(p, 4) for p in with_random.acceptance_per_position],
        "simulated_tau_trained": round(simulated_tau(cond_accuracies(best.val_metrics)) or 0.0, 4),
        "output_matches_greedy": with_trained.output_matches_greedy and with_random.output_matches_greedy,
        "k": with_trained.num_speculative_tokens,
        "prompts": with_trained.num_prompts,
        "new_tokens": with_trained.new_tokens,
        "max_new_tokens": config.eval_max_new_tokens,
        "spec_tokens_per_s_trained": round(with_trained.spec_tokens_per_s, 1),
        "spec_tokens_per_s_random": round(with_random.spec_tokens_per_s, 1),
        "greedy_tokens_per_s": round(with_trained.greedy_tokens_per_s, 1),
        "train_rows": trained.split.train_rows,
        "val_rows": trained.split.val_rows,
        "val_conversations": trained.split.val_conversations,
        "epochs": config.epochs,
        "loss_tokens_trained": trained.loss_tokens_trained,
        "loss_tokens_available": trained.loss_tokens_available,
        "torch_threads": torch.get_num_threads(),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
