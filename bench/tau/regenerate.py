"""Benchmark (not a test): τ of a draft trained on the target's own replies against one trained on the chats as written.

    .venv/bin/python bench/tau/regenerate.py --json [--assets data/demo] [--backend auto|vllm|transformers]

Builds (or reuses, with --assets, a folder `make demo` built) the demo target and chats, then:
1. splits the chats by conversation: the last --held-out conversations are held out, the rest is the
   training part (lines copied as they are);
2. regenerates the training part's replies with the target (workers/stages/regenerate; greedy,
   --max-new-tokens, --seed), with vLLM when it is installed (`make vllm`), else transformers;
3. trains two drafts as a run does (bench/tau/demo_draft.py: prepare -> extract -> vocab -> train), with the
   same RunConfig (the launch form's defaults; --epochs overrides) and seed, one on the training part as
   written and one on its regenerated replies: the replies are the only difference;
4. measures τ of both (workers/stages/evaluate/measure.py) on the same prompts: the first-reply contexts
   of the held-out conversations, which neither draft nor the regeneration saw, rendered with the
   target's chat template (workers/stages/evaluate/prompts.py: prompts_from_file), with the same
   max_new_tokens and k.
Keys: tau_original, tau_regenerated, ratio (tau_regenerated / tau_original), regenerate_tokens_per_s
and regenerate_backend (from the stage's result), with sizes, settings and seconds per phase.
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

from bench.tau.demo_draft import train_demo_draft  # noqa: E402
from runs.pipeline.launch.run_config import RunConfig  # noqa: E402
from workers.contract.chats.jsonl import read_conversations  # noqa: E402
from workers.contract.host.vllm_env import find_vllm_executable, vllm_install_at  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from workers.stages.evaluate.measure import evaluate  # noqa: E402
from workers.stages.evaluate.prompts import prompts_from_file  # noqa: E402
from workers.stages.regenerate.base import RegenerateSettings  # noqa: E402
from workers.stages.regenerate.stage import regenerate  # noqa: E402


def _assets(args, work: Path) -> tuple[Path, Path]:
    """(target directory, chats file): a folder `make demo` built, or the same recipe built here."""
    if args.assets:
        return args.assets / "demo-target", args.assets / "demo-chats.jsonl"
    built = build_demo_assets(work / "assets", num_conversations=args.conversations, train_steps=args.target_steps)
    return built.target_dir, built.chats_path


def _backend(asked: str) -> str:
    """auto: vLLM when this machine has a working install, else transformers."""
    if asked != "auto":
        return asked
    executable = find_vllm_executable()
    return "vllm" if executable and not isinstance(vllm_install_at(executable), str) else "transformers"


def _split(chats_path: Path, out_dir: Path, held_out: int) -> tuple[Path, Path, int]:
    """(training part, held-out part, conversations in the training part): the file's lines as they are,
    the last `held_out` non-empty lines held out."""
    lines = [line for line in chats_path.read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]
    if not 0 < held_out < len(lines):
        raise SystemExit(f"--held-out {held_out}: the chats hold {len(lines)} conversations; hold out fewer")
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, held_out_path = out_dir / "train-original.jsonl", out_dir / "held-out.jsonl"
    train_path.write_text("".join(lines[:-held_out]), encoding="utf-8")
    held_out_path.write_text("".join(lines[-held_out:]), encoding="utf-8")
    return train_path, held_out_path, len(lines) - held_out


def _replies_unchanged(original: Path, regenerated: Path) -> tuple[int, int]:
    """(replies the target wrote exactly as the file had them, replies compared): assistant turns matched
    by conversation id and position."""
    before = {c.source_id: [m["content"] for m in c.messages if m["role"] == "assistant"]
              for c in read_conversations(original)}
    same = compared = 0
    for conv in read_conversations(regenerated):
        old = before.get(conv.source_id, [])
        new = [m["content"] for m in conv.messages if m["role"] == "assistant"]
        for a, b in zip(old, new):
            compared += 1
            same += a.strip() == b.strip()
    return same, compared


def _prepared_tokens(prepared_dir: Path) -> dict:
    """Rows, tokens and supervised (reply) tokens of a prepared dataset."""
    from datasets import load_from_disk

    data = load_from_disk(str(prepared_dir)).with_format(None)
    return {"rows": len(data), "tokens": sum(len(ids) for ids in data["input_ids"]),
            "reply_tokens": sum(sum(mask) for mask in data["loss_mask"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--assets", type=Path, default=None, help="a folder `make demo` built (demo-target, chats)")
    parser.add_argument("--conversations", type=int, default=2000, help="demo chats to build (make demo's: 2,000)")
    parser.add_argument("--target-steps", type=int, default=600, help="demo target's training steps (make demo's: 600)")
    parser.add_argument("--held-out", type=int, default=100,
                        help="last conversations held out: each one's first-reply context is a prompt")
    parser.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="regeneration's reply limit")
    parser.add_argument("--seed", type=int, default=0, help="regeneration's seed (greedy: it only names the file)")
    parser.add_argument("--epochs", type=int, default=None, help="default: the launch form's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = RunConfig() if args.epochs is None else replace(RunConfig(), epochs=args.epochs)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-regenerate-"))
    phases: dict[str, float] = {}
    started = last = time.monotonic()

    def lap(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases[name], last = round(now - last, 1), now

    target_dir, chats_path = _assets(args, work)
    lap("assets")
    train_original, held_out_path, train_conversations = _split(chats_path, work / "split", args.held_out)
    prompts = prompts_from_file(held_out_path, target_dir, limit=args.held_out)

    backend = _backend(args.backend)
    settings = RegenerateSettings(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=args.seed)
    regenerated = regenerate(target_dir=target_dir, source_path=train_original,
                             out_path=work / "split" / "train-regenerated.jsonl", backend=backend, settings=settings,
                             work_dir=work / "regenerate", device="cpu")
    lap("regenerate")
    unchanged, compared = _replies_unchanged(train_original, Path(regenerated.out_path))

    drafts, taus = {}, {}
    for name, chats in (("original", train_original), ("regenerated", Path(regenerated.out_path))):
        drafts[name] = train_demo_draft(target_dir=target_dir, chats_path=chats, run_dir=work / f"run-{name}",
                                        config=config)
        lap(f"train_{name}")
    for name, draft in drafts.items():
        taus[name] = evaluate(target_dir=target_dir, checkpoint_dir=draft.best_dir, prompts=prompts,
                              prompt_source="held-out conversations", max_new_tokens=config.eval_max_new_tokens)
        lap(f"evaluate_{name}")
    original, regen = taus["original"], taus["regenerated"]
    if original.num_speculative_tokens != regen.num_speculative_tokens:
        raise SystemExit(f"the drafts propose {original.num_speculative_tokens} and {regen.num_speculative_tokens} "
                         "tokens: their τ would not compare")

    result = {
        "tau_original": round(original.tau, 4),
        "tau_regenerated": round(regen.tau, 4),
        "ratio": round(regen.tau / original.tau, 4),
        "acceptance_per_position_original": [round(p, 4) for p in original.acceptance_per_position],
        "acceptance_per_position_regenerated": [round(p, 4) for p in regen.acceptance_per_position],
        "output_matches_greedy": original.output_matches_greedy and regen.output_matches_greedy,
        "regenerate_tokens_per_s": round(regenerated.tokens_per_s, 1),
        "regenerate_backend": regenerated.backend,
        "regenerate_backend_version": regenerated.backend_version,
        "regenerate_generation_seconds": round(regenerated.seconds, 1),  # replies only: no model load or server start
        "regenerate_settings": {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                                "seed": settings.seed, "max_model_len": regenerated.max_model_len},
        "turns_regenerated": regenerated.turns_regenerated,
        "replies_cut": regenerated.replies_cut,
        "regenerate_failures": regenerated.failures,
        "regenerated_tokens": regenerated.generated_tokens,
        "replies_unchanged": unchanged,
        "replies_compared": compared,
        "conversations_train": train_conversations,
        "conversations_regenerated": regenerated.conversations,
        "conversations_held_out": args.held_out,
        "prompts": len(prompts),
        "prepared_original": _prepared_tokens(drafts["original"].run_dir / "prepared"),
        "prepared_regenerated": _prepared_tokens(drafts["regenerated"].run_dir / "prepared"),
        "loss_tokens_trained_original": drafts["original"].trained.loss_tokens_trained,
        "loss_tokens_trained_regenerated": drafts["regenerated"].trained.loss_tokens_trained,
        "new_tokens_original": original.new_tokens,
        "new_tokens_regenerated": regen.new_tokens,
        "k": original.num_speculative_tokens,
        "max_new_tokens": config.eval_max_new_tokens,
        "epochs": config.epochs,
        "seed": config.seed,
        "torch_threads": torch.get_num_threads(),
        "phase_seconds": phases,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
