"""Benchmark (not a test): what the k table costs and what it says, on the demo target.

    OMP_NUM_THREADS=1 .venv/bin/python bench/tau/k_table.py --json [--prompts 16] [--new-tokens 64] [--beyond 2]

Trains the demo's draft as a run does (bench/tau/demo_draft.py, the launch form's defaults), then measures its
best checkpoint on held-out prompts twice with the evaluate stage function: without the k table
(k_beyond -1) and with it (k = 1 .. trained + --beyond, one probing decode per prompt). Prints the seconds of
each, the table (τ and tokens per target forward by k), the recommended k and the draft's cost ratio, and
the seconds separate speculative decodes at every k would take (the honest alternative the table replaces),
with whether their τ equal the table's."""
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

from bench.tau.demo_draft import train_demo_draft  # noqa: E402
from runs.pipeline.launch.run_config import RunConfig  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from workers.stages.evaluate.measure import Eagle3Proposer, evaluate, load_draft  # noqa: E402
from workers.stages.evaluate.speculative import eos_ids, measure  # noqa: E402
from workers.stages.extract.model import load_target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--beyond", type=int, default=2)
    parser.add_argument("--work-dir", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="k-table-"))
    assets = build_demo_assets(work / "assets", num_conversations=150, train_steps=12, seed=0)
    draft = train_demo_draft(target_dir=assets.target_dir, chats_path=assets.chats_path, run_dir=work / "run",
                             config=replace(RunConfig(), eval_prompts=args.prompts))
    common = dict(target_dir=assets.target_dir, checkpoint_dir=draft.best_dir, prompts=draft.prompts,
                  prompt_source="held-out", max_new_tokens=args.new_tokens)
    t0 = time.perf_counter()
    plain = evaluate(**common, k_beyond=-1)
    t1 = time.perf_counter()
    tabled = evaluate(**common, k_beyond=args.beyond)
    t2 = time.perf_counter()
    model = load_target(assets.target_dir, torch.device("cpu"))
    loaded = load_draft(draft.best_dir, model, torch.device("cpu"), torch.float32)
    separate, t3 = {}, time.perf_counter()
    for k in range(1, tabled.k_table["k_max"] + 1):
        separate[k] = measure(model, draft.prompts, aux_layer_ids=list(loaded.target_layer_ids),
                              new_proposer=lambda _: Eagle3Proposer(loaded), k=k, max_new_tokens=args.new_tokens,
                              eos=eos_ids(model)).tau
    t4 = time.perf_counter()
    rows = tabled.k_table["rows"]
    out = {"device": tabled.device, "prompts": len(draft.prompts), "new_tokens": args.new_tokens,
           "trained_k": plain.num_speculative_tokens, "k_max": tabled.k_table["k_max"],
           "evaluate_seconds_without_table": round(t1 - t0, 2), "evaluate_seconds_with_table": round(t2 - t1, 2),
           "separate_decodes_seconds": round(t4 - t3, 2),
           "draft_cost": round(tabled.k_table["draft_cost"], 4), "recommended_k": tabled.recommended_k,
           "tau_by_k": {k: round(r["tau"], 4) for k, r in rows.items()},
           "tokens_per_target_forward_by_k": {k: round(r["tokens_per_target_forward"], 4) for k, r in rows.items()},
           "table_equals_separate_decodes": all(rows[str(k)]["tau"] == tau for k, tau in separate.items())}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
