"""Benchmark (not a test): what measuring τ while training costs the training (issue 39).

    .venv/bin/python bench/tau/deploy_gate.py --json [--epochs 4] [--threads 1]

On the demo target's rows (prepared, extracted and mapped once), the training loop runs twice on the same
rows with the same seed: alone, then with live τ, where each checkpoint, as it is saved, is measured by
another process (the evaluate stage's own `evaluate()`, k table included, on the held-out prompts), one
at a time, a checkpoint saved while one is measured waiting for it and replaced by a newer one, as
runs.pipeline.status.live_tau does with the queue. Reported: training tokens/s of each, their ratio, and per
measured checkpoint its τ, recommended k and the seconds its measurement took (τ and the k table).

The measuring process is a separate process on THIS host: on a small machine it competes with the training
for the same cores, so the cost printed is an upper bound; the issue's target (at most 10%) is for an
evaluate queue on another worker host, where the training only pays registering the checkpoint.

Then the serve check (workers.stages.evaluate.serve_check) serves the last checkpoint with real vLLM (`make
vllm`) at the recommended k, with the draft and without, on 8 held-out prompts (32 new tokens) at each
--serve-concurrency level (default 1,8,32): `serve_speedup_by_concurrency` is its table, a row per level
(output tokens/s and time per output token with and without, the speed-up, the device: "cpu" rows are CPU
figures, from vLLM's CPU build). Without vLLM here it is null and `serve_check_skipped` says why."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def evaluate_one(target_dir: str, checkpoint_dir: str, prepared_dir: str, out_path: str, threads: int) -> None:
    import torch

    from workers.stages.evaluate.measure import evaluate
    from workers.stages.evaluate.prompts import prompts_from_prepared
    from workers.contract.chats.prompt_source import validation_rows

    torch.set_num_threads(threads)
    started = time.perf_counter()
    prompts = prompts_from_prepared(Path(prepared_dir), validation_rows(Path(checkpoint_dir).parent), limit=8)
    result = evaluate(target_dir=Path(target_dir), checkpoint_dir=Path(checkpoint_dir), prompts=prompts,
                      prompt_source="held-out", max_new_tokens=32, device="cpu")
    Path(out_path).write_text(json.dumps({"checkpoint": checkpoint_dir, "tau": result.tau,
                                          "recommended_k": getattr(result, "recommended_k", None),
                                          "seconds": time.perf_counter() - started}))


class LiveEvaluator:
    """One measuring process at a time; the newest checkpoint saved meanwhile waits for it."""

    def __init__(self, *, target_dir: Path, prepared_dir: Path, work: Path, threads: int):
        self.target_dir, self.prepared_dir, self.work, self.threads = target_dir, prepared_dir, work, threads
        self.proc: subprocess.Popen | None = None
        self.waiting: Path | None = None
        self.outputs: list[Path] = []

    def _start(self, checkpoint: Path) -> None:
        out = self.work / f"measured-{len(self.outputs)}.json"
        self.outputs.append(out)
        self.proc = subprocess.Popen([sys.executable, __file__, "--evaluate-one", str(self.target_dir), str(checkpoint),
                                      str(self.prepared_dir), str(out), str(self.threads)])

    def saved(self, checkpoint: Path) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.waiting = checkpoint
            return
        self._start(checkpoint)

    def finish(self) -> list[dict]:
        while self.proc is not None:
            self.proc.wait()
            self.proc = None
            if self.waiting is not None:
                checkpoint, self.waiting = self.waiting, None
                self._start(checkpoint)
        return [json.loads(p.read_text()) for p in self.outputs if p.exists()]


def serve_table(*, target_dir: Path, prepared_dir: Path, checkpoints, measured: list[dict], concurrency: list[int],
                work: Path) -> dict:
    """The serve check's speed-up table of the last checkpoint, at the k its measurement recommended."""
    from workers.contract.host.backends import vllm_executable
    from workers.contract.host.vllm_env import vllm_install
    from workers.stages.evaluate.prompts import prompts_from_prepared, validation_rows
    from workers.stages.evaluate.serve_check import serve_check

    install = vllm_install()
    if isinstance(install, str):
        return {"serve_speedup_by_concurrency": None, "serve_check_skipped": install}
    last = Path(checkpoints[-1].path)
    k = next((m["recommended_k"] for m in measured if Path(m["checkpoint"]) == last), None)
    prompts = prompts_from_prepared(prepared_dir, validation_rows(last.parent), limit=8)
    started = time.perf_counter()
    served = serve_check(target_dir=target_dir, checkpoint_dir=last, prompts=prompts, max_new_tokens=32,
                         out_dir=work / "serve_check", vllm_executable=vllm_executable(), num_speculative_tokens=k,
                         concurrency=concurrency)
    rows = [{key: round(v, 3) if isinstance(v, float) else v for key, v in row.items()}
            for row in served.concurrency_results]
    return {"serve_speedup_by_concurrency": rows, "serve_k": served.num_speculative_tokens,
            "serve_prompts": len(prompts), "serve_max_new_tokens": 32, "serve_vllm": f"{served.vllm_version} "
            f"({served.vllm_build} build)", "serve_tau_emitted": round(served.vllm_tau_emitted, 3),
            "serve_seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--evaluate-one":
        evaluate_one(*sys.argv[2:6], threads=int(sys.argv[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training and of the measuring")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--serve-concurrency", default="1,8,32", help="the serve check's load levels")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    from workers.contract.target import default_layer_ids, read_target_config
    from workers.stages.demo.assets import build_demo_assets
    from workers.stages.extract.with_transformers import extract
    from workers.stages.prepare.stage import prepare
    from workers.stages.train import loop as train_stage
    from workers.stages.vocab import build_vocab

    torch.set_num_threads(args.threads)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-deploy-gate-"))
    assets = build_demo_assets(work / "assets", num_conversations=150, train_steps=12, seed=0)
    target = read_target_config(assets.target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    prep = prepare(tokenizer_dir=assets.target_dir, dataset_path=assets.chats_path, out_dir=work / "prepared",
                   max_seq_len=256, max_samples=120)
    ext = extract(target_dir=assets.target_dir, prepared_dir=prep.out_dir, out_dir=work / "extraction",
                  layer_ids=layer_ids)
    vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=work / "vocab", draft_vocab_size=256,
                        target_vocab_size=target.vocab_size)

    def train(name: str, on_checkpoint=None):
        return train_stage.train(target_dir=assets.target_dir, prepared_dir=prep.out_dir,
                                 hidden_states_dir=Path(ext.hidden_states_dir), d2t_path=vocab.d2t_path,
                                 t2d_path=vocab.t2d_path, out_dir=work / name, layer_ids=layer_ids, epochs=args.epochs,
                                 lr=3e-3, ttt_steps=2, draft_vocab_size=vocab.draft_vocab_size, seed=0, device="cpu",
                                 on_checkpoint=on_checkpoint)

    alone = train("alone")
    live = LiveEvaluator(target_dir=assets.target_dir, prepared_dir=prep.out_dir, work=work, threads=args.threads)
    with_live = train("live", on_checkpoint=lambda c: live.saved(Path(c.path)))
    measured = live.finish()
    result = {
        "rows": prep.num_rows, "epochs": args.epochs, "torch_threads": args.threads, "cpu_cores": os.cpu_count(),
        "train_tokens_per_s_alone": round(alone.tokens_per_second, 1),
        "train_tokens_per_s_with_live_tau": round(with_live.tokens_per_second, 1),
        "live_tau_cost": round(1 - with_live.tokens_per_second / alone.tokens_per_second, 3),
        "evaluator": "another process on this host (shares its cores)",
        "measured": [{"epoch": int(Path(m["checkpoint"]).name) + 1, "tau": round(m["tau"], 3),
                      "recommended_k": m["recommended_k"], "seconds": round(m["seconds"], 1)} for m in measured],
        **serve_table(target_dir=assets.target_dir, prepared_dir=prep.out_dir, checkpoints=with_live.checkpoints,
                      measured=measured, concurrency=[int(c) for c in args.serve_concurrency.split(",")], work=work),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
