"""Benchmark (not a test): the checkpoint chosen by measured τ against the one chosen by validation loss.

    .venv/bin/python bench/tau/best_by.py --json [--seeds 0,1,2] [--epochs 4] [--work-dir DIR]

For each seed, trains the demo's draft as a run does (prepare -> extract -> vocab -> train with the
launch form's defaults, the seed and --epochs; bench/tau/demo_draft.py), with the split held out by
content (no validation conversation shares a prompt context with another conversation), then
measures τ of EVERY checkpoint on held-out prompts (the evaluate stage's first-reply contexts of
validation conversations, 64 new tokens at most, greedy, k from the checkpoint), in two disjoint
halves of --prompts each: the first half chooses (by τ: highest, validation loss breaking ties, the
rule of runs.pipeline.best; by validation loss: lowest, speculators' rule and this product's before),
the second half reports the chosen checkpoints' τ, so that the pick by τ is not scored on the prompts
that picked it. Prints per seed every checkpoint's (epoch, validation loss, τ on each half) and,
over the seeds, the mean reported τ of each pick.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.tau.demo_draft import train_demo_draft  # noqa: E402
from runs.pipeline.launch.run_config import RunConfig  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from workers.stages.evaluate.measure import evaluate  # noqa: E402


def pick_by_tau(checkpoints: list[dict]) -> dict:
    return max(checkpoints, key=lambda c: (c["tau_choose"], -c["val_loss"]))


def pick_by_val_loss(checkpoints: list[dict]) -> dict:
    return min(checkpoints, key=lambda c: (c["val_loss"], c["epoch"]))


def one_seed(*, assets, work: Path, seed: int, epochs: int, prompts: int) -> dict:
    config = replace(RunConfig(), seed=seed, epochs=epochs, eval_prompts=2 * prompts)
    draft = train_demo_draft(target_dir=assets.target_dir, chats_path=assets.chats_path,
                             run_dir=work / f"seed-{seed}", config=config)
    if len(draft.prompts) < 2 * prompts:
        raise SystemExit(f"seed {seed}: {len(draft.prompts)} held-out prompts, fewer than two halves of {prompts}")
    halves = {"choose": draft.prompts[:prompts], "report": draft.prompts[prompts:]}
    checkpoints = []
    for checkpoint in draft.trained.checkpoints:
        row = {"epoch": checkpoint.epoch, "val_loss": round(checkpoint.val_loss, 5)}
        for half, half_prompts in halves.items():
            measured = evaluate(checkpoint_dir=checkpoint.path, target_dir=assets.target_dir, prompts=half_prompts,
                                prompt_source="validation conversations", max_new_tokens=config.eval_max_new_tokens)
            row[f"tau_{half}"] = round(measured.tau, 4)
        checkpoints.append(row)
    by_tau, by_loss = pick_by_tau(checkpoints), pick_by_val_loss(checkpoints)
    split = draft.trained.split
    return {"seed": seed, "checkpoints": checkpoints,
            "by_tau": {"epoch": by_tau["epoch"], "tau": by_tau["tau_report"]},
            "by_val_loss": {"epoch": by_loss["epoch"], "tau": by_loss["tau_report"]},
            "prompts_per_half": prompts, "val_conversations": split.val_conversations,
            "held_out_duplicates_removed": getattr(split, "held_out_duplicates_removed", None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=4, help="checkpoints to choose from (one per epoch)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts in each half (choose, report)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-best-by-"))
    started = time.monotonic()
    assets = build_demo_assets(work / "assets")  # make demo's recipe: 2,000 chats, 600 target steps
    seeds = [one_seed(assets=assets, work=work, seed=int(s), epochs=args.epochs, prompts=args.prompts) for s in args.seeds.split(",")]
    result = {
        "seeds": seeds,
        "mean_tau_by_tau": round(statistics.mean(s["by_tau"]["tau"] for s in seeds), 4),
        "mean_tau_by_val_loss": round(statistics.mean(s["by_val_loss"]["tau"] for s in seeds), 4),
        "picks_differ": sum(s["by_tau"]["epoch"] != s["by_val_loss"]["epoch"] for s in seeds),
        "epochs": args.epochs,
        "torch_threads": torch.get_num_threads(),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
