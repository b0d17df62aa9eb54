"""Benchmark (not a test): vLLM's acceptance length against ours for a draft trained on the demo.

    .venv/bin/python bench/tau/serve_check.py --json [--assets data/demo] [--epochs N]

Builds (or reuses, with --assets, a folder `make demo` built) the demo target and chats, runs prepare ->
extract -> vocab -> train with the launch form's defaults (RunConfig; --epochs overrides), measures τ
with our decoding on the held-out conversations (workers/stages/evaluate/measure.py), then runs the serve
check on the very same prompts (workers/stages/evaluate/serve_check.py): `vllm serve` with the draft, exactly
the line a checkpoint page prints, then the target alone, greedy, one request at a time, same dtype.
Needs `make vllm`. Keys: tau (ours), vllm_tau (vLLM's counters: 1 + accepted / drafts),
vllm_tau_emitted (tokens vLLM emitted after each prompt's first, over its drafts: our definition),
tau_difference (vllm_tau_emitted - tau), acceptance per position on both sides, whether vLLM's text
with the draft equals its text without, and tokens/s with and without the draft on both engines.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from runs.pipeline.launch.run_config import RunConfig  # noqa: E402
from workers.contract.host.backends import vllm_executable  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from bench.tau.demo_draft import train_demo_draft  # noqa: E402
from workers.stages.evaluate.measure import evaluate  # noqa: E402
from workers.stages.evaluate.serve_check import serve_check  # noqa: E402


def _assets(args, work: Path) -> tuple[Path, Path]:
    """(target directory, chats file): a folder `make demo` built, or the same recipe built here."""
    if args.assets:
        return args.assets / "demo-target", args.assets / "demo-chats.jsonl"
    built = build_demo_assets(work / "assets")
    return built.target_dir, built.chats_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--assets", type=Path, default=None, help="a folder `make demo` built (demo-target, chats)")
    parser.add_argument("--epochs", type=int, default=None, help="default: the launch form's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = RunConfig() if args.epochs is None else replace(RunConfig(), epochs=args.epochs)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-serve-check-"))
    started = time.monotonic()
    target_dir, chats_path = _assets(args, work)
    draft = train_demo_draft(target_dir=target_dir, chats_path=chats_path, run_dir=work / f"run-{int(time.time())}",
                             config=config)
    prompts, run_dir = draft.prompts, draft.run_dir
    ours = evaluate(target_dir=target_dir, checkpoint_dir=draft.best_dir, prompts=prompts,
                    prompt_source="validation conversations", max_new_tokens=config.eval_max_new_tokens)
    served = serve_check(target_dir=target_dir, checkpoint_dir=draft.best_dir, prompts=prompts,
                         max_new_tokens=config.eval_max_new_tokens, out_dir=run_dir / "serve_check",
                         vllm_executable=vllm_executable())
    result = {
        "tau": round(ours.tau, 4),
        "vllm_tau": round(served.vllm_tau, 4),
        "vllm_tau_emitted": round(served.vllm_tau_emitted, 4),
        "tau_difference": round(served.vllm_tau_emitted - ours.tau, 4),
        "acceptance_per_position": [round(p, 4) for p in ours.acceptance_per_position],
        "vllm_acceptance_per_position": [round(p, 4) for p in served.vllm_acceptance_per_position],
        "output_matches_greedy": ours.output_matches_greedy,
        "vllm_output_matches_greedy": served.vllm_output_matches_greedy,
        "vllm_tokens_per_s_with": round(served.vllm_tokens_per_s_with, 1),
        "vllm_tokens_per_s_without": round(served.vllm_tokens_per_s_without, 1),
        "vllm_speedup": round(served.vllm_speedup, 3),
        "spec_tokens_per_s": round(ours.spec_tokens_per_s, 1),
        "greedy_tokens_per_s": round(ours.greedy_tokens_per_s, 1),
        "verify_forwards": ours.verify_forwards,
        "vllm_drafts": served.vllm_drafts,
        "new_tokens": ours.new_tokens,
        "vllm_new_tokens": served.vllm_new_tokens,
        "k": served.num_speculative_tokens,
        "prompts": len(prompts),
        "max_new_tokens": config.eval_max_new_tokens,
        "dtype": served.dtype,
        "epochs": config.epochs,
        "vllm_version": served.vllm_version,
        "vllm_build": served.vllm_build,
        "torch_threads": torch.get_num_threads(),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
