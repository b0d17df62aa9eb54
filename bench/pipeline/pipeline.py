"""Benchmark (not a test): the pipeline's stages against bare loops over the same data, in one run.

    .venv/bin/python bench/pipeline/pipeline.py --json [--only extract|train] [--repeats N]

Extraction, both sides after their model is loaded (load time excluded on both), in one process,
alternating bare, stage, bare, stage, ... (one uncounted warm-up pair, then `--repeats` pairs; each
stage run writes into a fresh output directory, none removed) and reporting each side's median:
  stage  `extract()`: opens and checks the prepared rows, scans the token ids against the target's
         vocabulary, runs the batches, checks each batch's hidden states are finite, then per row
         writes hs_{i}.safetensors (temp file + rename) and counts its bytes, reports progress and
         writes data_config.json. Timed as its total_time_seconds minus its model_load_seconds.
  bare   `iter_hidden_states()` over the same loaded rows: the stage's own generator, so the same
         rows in the same order, the same plan_forward_batches batches and _pad padding, the base model
         (no lm_head) with the same LayerCapture hooks and the same .to(bf16).cpu() of the
         captured layers; nothing checked, nothing written.
`extract_vs_bare` = stage tokens/s / bare tokens/s: what the stage's own work (checks, files,
manifest) costs on top of the forwards.
Training: tokens/s through `train` (training steps only) against a bare forward/backward/step loop
over the same batches with the same model. Disk: bytes per token against the L x H x 2 floor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from workers.stages.train import loop as train_stage  # noqa: E402
from workers.stages.train.data import HiddenStateSamples, iter_batches, plan_training_steps, token_budget  # noqa: E402
from workers.stages.train.draft.model import build_draft_model, make_optimizer  # noqa: E402
from workers.stages.train.holdout.split import split_train_val  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from workers.stages.extract.output.result import ExtractionResult  # noqa: E402
from workers.stages.extract.batch_plan import batch_token_budget, open_prepared  # noqa: E402
from workers.stages.extract.with_transformers import extract, iter_hidden_states  # noqa: E402
from workers.stages.extract.model import load_target  # noqa: E402
from workers.stages.device import resolve_device  # noqa: E402
from workers.stages.prepare.stage import prepare  # noqa: E402
from workers.contract.target import default_layer_ids, read_target_config  # noqa: E402
from workers.stages.vocab import build_vocab  # noqa: E402


def bare_extract_seconds(model, data, lengths: list[int], layer_ids: list[int], device: torch.device) -> float:
    """The stage's batches, forwards and CPU copies, with nothing checked or written."""
    start = time.perf_counter()
    for _ in iter_hidden_states(model, data, lengths, batch_token_budget(device.type), layer_ids, device):
        pass
    return time.perf_counter() - start


def measure_extraction(target_dir: Path, prepared_dir: Path, work: Path, layer_ids: list[int],
                       repeats: int) -> tuple[dict, ExtractionResult]:
    """Alternating bare and stage runs; the medians, and the last stage run's result (kept on disk)."""
    device = resolve_device("auto")
    model = load_target(target_dir, device)
    data, lengths = open_prepared(prepared_dir)
    tokens = sum(lengths)
    bare_s, stage_s, runs = [], [], []
    # Round 0 is a warm-up on both sides (first-call allocations, lazy imports) and is not counted.
    for k in range(repeats + 1):
        bare_s.append(bare_extract_seconds(model, data, lengths, layer_ids, device))
        runs.append(extract(target_dir=target_dir, prepared_dir=prepared_dir, out_dir=work / f"extraction-{k}",
                            layer_ids=layer_ids, device=str(device)))
        assert runs[-1].total_tokens == tokens
        stage_s.append(runs[-1].total_time_seconds - runs[-1].model_load_seconds)
    bare_s, stage_s = bare_s[1:], stage_s[1:]
    del model
    # Every run's files stay (12 MB each on the demo target): on ext4 without a journal (this box),
    # creating files within ~30 s of deleting many costs several times more (`recently_deleted` in
    # the inode allocator), so a cleanup here would be charged to the next stage run, or the next bench.
    ext = runs[-1]
    stage_tps, bare_tps = tokens / statistics.median(stage_s), tokens / statistics.median(bare_s)
    return {
        "device": ext.device,
        "repeats": repeats,
        "extract_tokens_per_s": round(stage_tps, 1),
        "bare_extract_tokens_per_s": round(bare_tps, 1),
        "extract_vs_bare": round(stage_tps / bare_tps, 3),
        "extract_seconds": [round(x, 3) for x in stage_s],
        "bare_extract_seconds": [round(x, 3) for x in bare_s],
        "model_load_seconds": round(ext.model_load_seconds, 3),
        "bytes_per_token": round(ext.bytes_per_token, 1),
        "floor_bytes_per_token": ext.floor_bytes_per_token,
    }, ext


def bare_train_tokens_per_s(*, target_dir, prepared_dir, hs_dir, vocab, layer_ids, ttt_steps, lr, seed=0) -> float:
    """The stage's own batches, model and step (workers.stages.train.step.stepper.DraftStepper: the same attention,
    loss and dtype), with none of its metrics, progress, prefetching or checkpoints."""
    from workers.stages.train.step.stepper import DraftStepper

    hidden = read_target_config(target_dir).hidden_size
    samples = HiddenStateSamples(prepared_dir=prepared_dir, hidden_states_dir=hs_dir,
                                             layer_ids=layer_ids, hidden_size=hidden)
    from workers.stages.train.holdout.prompt_keys import prompt_context_keys

    train_idx, _, _ = split_train_val(samples.source_ids, val_fraction=0.1, seed=seed,
                                                  num_rows=len(samples), prompt_keys=prompt_context_keys(samples.rows))
    max_tokens = token_budget(None, samples.lengths)  # the stage's default budget
    plan = plan_training_steps(samples.lengths, train_idx, max_tokens=max_tokens, seed=seed, epoch=0)
    model = build_draft_model(target_dir=target_dir, layer_ids=layer_ids, d2t_path=vocab.d2t_path,
                                          t2d_path=vocab.t2d_path, draft_vocab_size=vocab.draft_vocab_size,
                                          ttt_steps=ttt_steps, seed=seed)
    model.train()
    optimizer, scheduler = make_optimizer(model, lr=lr, total_steps=len(plan))
    stepper = DraftStepper(model, device=torch.device("cpu"), ttt_steps=ttt_steps)
    tokens, seconds = 0, 0.0
    batches = iter_batches(samples, plan, max_tokens=max_tokens)
    t0 = time.perf_counter()
    for batch in batches:
        stepper.train_step(batch, optimizer, scheduler)
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
    parser.add_argument("--only", choices=("extract", "train"), default=None,
                        help="run one side (train still extracts once, untimed, for its inputs)")
    parser.add_argument("--repeats", type=int, default=5, help="bare/stage extraction pairs")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-bench-"))
    assets = build_demo_assets(work / "assets", num_conversations=args.conversations, train_steps=60)
    target = read_target_config(assets.target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    work.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="run-", dir=work))  # a reused --work-dir keeps only the assets
    prep = prepare(tokenizer_dir=assets.target_dir, dataset_path=assets.chats_path, out_dir=run / "prepared",
                   max_seq_len=512, max_samples=args.max_samples)

    result = {"rows": prep.num_rows}
    if args.only == "train":
        ext = extract(target_dir=assets.target_dir, prepared_dir=prep.out_dir, out_dir=run / "extraction",
                      layer_ids=layer_ids)
    else:
        extraction, ext = measure_extraction(assets.target_dir, prep.out_dir, run, layer_ids, args.repeats)
        result.update(extraction)
    result.update({"tokens": ext.total_tokens, "layers_captured": ext.num_layers_captured,
                   "hidden_size": ext.hidden_size})

    if args.only != "extract":
        vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=run / "vocab",
                            draft_vocab_size=min(args.draft_vocab_size, target.vocab_size),
                            target_vocab_size=target.vocab_size)
        hs_dir = Path(ext.hidden_states_dir)
        bare_train = bare_train_tokens_per_s(target_dir=assets.target_dir, prepared_dir=prep.out_dir, hs_dir=hs_dir,
                                             vocab=vocab, layer_ids=layer_ids, ttt_steps=args.ttt_steps, lr=3e-4)
        trained = train_stage.train(target_dir=assets.target_dir, prepared_dir=prep.out_dir, hidden_states_dir=hs_dir,
                                    d2t_path=vocab.d2t_path, t2d_path=vocab.t2d_path, out_dir=run / "checkpoints",
                                    layer_ids=layer_ids, epochs=1, lr=3e-4, ttt_steps=args.ttt_steps,
                                    draft_vocab_size=vocab.draft_vocab_size)
        result.update({
            "train_tokens_per_s": round(trained.tokens_per_second, 1),
            "bare_train_tokens_per_s": round(bare_train, 1),
            "train_vs_bare": round(trained.tokens_per_second / bare_train, 3),
        })
    result["torch_threads"] = torch.get_num_threads()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
