"""Benchmark (not a test): acceptance length of the demo's trained draft against an untrained one.

    .venv/bin/python bench/tau/acceptance.py --json

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
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from runs.pipeline.launch.run_config import RunConfig  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from bench.tau.demo_draft import train_demo_draft  # noqa: E402
from workers.stages.evaluate.measure import evaluate  # noqa: E402
from workers.stages.train.draft.model import build_draft_model  # noqa: E402


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
    draft = train_demo_draft(target_dir=assets.target_dir, chats_path=assets.chats_path,
                             run_dir=work / f"run-{int(time.time())}", config=config)
    trained, best, prompts = draft.trained, next(c for c in draft.trained.checkpoints if c.is_best), draft.prompts
    random_dir = draft.run_dir / "untrained"
    build_draft_model(target_dir=assets.target_dir, layer_ids=draft.layer_ids, d2t_path=draft.vocab.d2t_path,
                      t2d_path=draft.vocab.t2d_path, draft_vocab_size=draft.draft_vocab_size, ttt_steps=config.ttt_steps,
                      seed=config.seed).save_pretrained(str(random_dir))

    common = dict(target_dir=assets.target_dir, prompts=prompts, prompt_source="validation conversations",
                  max_new_tokens=config.eval_max_new_tokens)
    with_trained = evaluate(checkpoint_dir=best.path, **common)
    with_random = evaluate(checkpoint_dir=random_dir, **common)
    from workers.contract.acceptance import cond_accuracies, simulated_tau

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
