"""Benchmark (not a test): the pipeline's stages against bare loops over the same data, in one run.

    .venv/bin/python bench/pipeline.py --json

Extraction: tokens/s through `extract` (model load excluded, file writes included) against a bare
transformers forward with output_hidden_states over the same rows, one row per call, nothing written.
Training: tokens/s through `train` (training steps only) against a bare forward/backward/step loop
over the same batches with the same model. Disk: bytes per token against the L x H x 2 floor.
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
from datasets import load_from_disk  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from workers.stages import train as train_stage  # noqa: E402
from workers.stages.demo_assets import build_demo_assets  # noqa: E402
from workers.stages.extract import extract  # noqa: E402
from workers.stages.prepare import prepare  # noqa: E402
from workers.stages.target import default_layer_ids, read_target_config  # noqa: E402
from workers.stages.vocab import build_vocab  # noqa: E402


def bare_forward_tokens_per_s(target_dir: Path, prepared_dir: Path) -> float:
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    rows = load_from_disk(str(prepared_dir))["input_ids"]
    tokens, start = 0, time.perf_counter()
    with torch.no_grad():
        for ids in rows:
            ids = torch.as_tensor(ids).view(1, -1)
            model(input_ids=ids, output_hidden_states=True)
            tokens += ids.shape[1]
    return tokens / (time.perf_counter() - start)


def bare_train_tokens_per_s(*, target_dir, prepared_dir, hs_dir, vocab, layer_ids, ttt_steps, lr, seed=0) -> float:
    """The stage's own batches and model, with none of its metrics, progress or checkpoints."""
    hidden = read_target_config(target_dir).hidden_size
    samples = train_stage.HiddenStateSamples(prepared_dir=prepared_dir, hidden_states_dir=hs_dir,
                                             layer_ids=layer_ids, hidden_size=hidden)
    train_idx, _ = train_stage.split_indices(len(samples), val_fraction=0.1, seed=seed)
    max_tokens = 256
    plan = train_stage.plan_batches(samples.lengths, train_idx, max_tokens=max_tokens, seed=seed, epoch=0)
    model = train_stage.build_draft_model(target_dir=target_dir, layer_ids=layer_ids, d2t_path=vocab.d2t_path,
                                          t2d_path=vocab.t2d_path, draft_vocab_size=vocab.draft_vocab_size,
                                          ttt_steps=ttt_steps, seed=seed)
    model.train()
    optimizer, scheduler = train_stage.make_optimizer(model, lr=lr, total_steps=len(plan))
    kwargs = train_stage.model_call_kwargs(ttt_steps)
    tokens, seconds = 0, 0.0
    batches = train_stage.iter_batches(samples, plan, max_tokens=max_tokens)
    t0 = time.perf_counter()
    for batch in batches:
        train_stage.train_step(model, batch, optimizer, scheduler, kwargs)
        t1 = time.perf_counter()
        tokens += int((batch["document_ids"] != -1).sum())
        seconds += t1 - t0
        t0 = time.perf_counter()
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--max-samples", type=int, default=300)
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-bench-"))
    assets = build_demo_assets(work / "assets", num_conversations=args.conversations, train_steps=60)
    target = read_target_config(assets.target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    prep = prepare(tokenizer_dir=assets.target_dir, dataset_path=assets.chats_path, out_dir=work / "prepared",
                   max_seq_len=512, max_samples=args.max_samples)

    bare_forward = bare_forward_tokens_per_s(assets.target_dir, prep.out_dir)
    ext = extract(target_dir=assets.target_dir, prepared_dir=prep.out_dir, out_dir=work / "extraction",
                  layer_ids=layer_ids)
    extract_tps = ext.total_tokens / (ext.total_time_seconds - ext.model_load_seconds)

    vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=work / "vocab",
                        draft_vocab_size=min(args.draft_vocab_size, target.vocab_size),
                        target_vocab_size=target.vocab_size)
    hs_dir = Path(ext.hidden_states_dir)
    bare_train = bare_train_tokens_per_s(target_dir=assets.target_dir, prepared_dir=prep.out_dir, hs_dir=hs_dir,
                                         vocab=vocab, layer_ids=layer_ids, ttt_steps=args.ttt_steps, lr=3e-4)
    trained = train_stage.train(target_dir=assets.target_dir, prepared_dir=prep.out_dir, hidden_states_dir=hs_dir,
                                d2t_path=vocab.d2t_path, t2d_path=vocab.t2d_path, out_dir=work / "checkpoints",
                                layer_ids=layer_ids, epochs=1, lr=3e-4, ttt_steps=args.ttt_steps,
                                draft_vocab_size=vocab.draft_vocab_size)
    result = {
        "rows": prep.num_rows,
        "tokens": ext.total_tokens,
        "layers_captured": ext.num_layers_captured,
        "hidden_size": ext.hidden_size,
        "extract_tokens_per_s": round(extract_tps, 1),
        "bare_forward_tokens_per_s": round(bare_forward, 1),
        "extract_vs_bare": round(extract_tps / bare_forward, 3),
        "model_load_seconds": round(ext.model_load_seconds, 3),
        "train_tokens_per_s": round(trained.tokens_per_second, 1),
        "bare_train_tokens_per_s": round(bare_train, 1),
        "train_vs_bare": round(trained.tokens_per_second / bare_train, 3),
        "bytes_per_token": round(ext.bytes_per_token, 1),
        "floor_bytes_per_token": ext.floor_bytes_per_token,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
