"""GPU check (not a test): the pipeline's stages on a randomly initialised ~1B Llama target, on one GPU.

    bench/gpu_check.sh                      # sets Python up when needed, runs this under `timeout 480`
    bench/gpu_check.sh --device cpu --tiny  # the same code path on a small model, on this CPU

Built offline, nothing fetched: a BPE tokenizer trained on the demo's procedural chats, a
Llama-architecture target with random weights (hidden 2048, 16 layers, 32 heads / 8 KV heads,
intermediate 8192, vocabulary 32,000: 1.1B parameters), and single-reply chats of 1,024-2,048 tokens
made from the demo chats' texts. Then the stages' own functions, with no Django and no database:
prepare -> extract (transformers) -> vocab -> train (our loop), and, when there is time left and a
GPU, extract with vLLM (workers.stages.extract.with_vllm, when vllm imports) and train with speculators'
Trainer (workers.stages.train.with_speculators.trainer, when it exists). The optional stages run last so that a
slow engine start cannot cost the core figures.

Prints one JSON object: GPU, date, and per stage the wall time, tokens/s, peak GPU memory
(torch.cuda.max_memory_allocated of this process, reset per stage, and the device's peak used memory
sampled every 50 ms, which also sees vLLM's engine process), achieved TFLOP/s and its fraction of
the GPU's dense bf16 peak (bench/gpu_peaks.py says how FLOPs are counted). The same object is
rewritten to WORK/gpu_check.json after every stage, so that a run cut short still leaves its figures.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata
import inspect
import json
import os
import random
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from gpu_peaks import achieved, bf16_peak, draft_train_flops_per_token, target_forward_flops_per_token  # noqa: E402

# The full check's target is Llama-3.2-1B's shape with a 32,000-token vocabulary; --tiny is the
# same architecture small enough for a 2-core CPU.
SHAPES = {
    "full": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=8192, vocab_size=32000, rows=256, min_tokens=1024, max_tokens=2048,
                 demo_conversations=2000, draft_vocab_size=8192, tokens_per_step=8192),
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=4096, rows=24, min_tokens=128, max_tokens=256,
                 demo_conversations=300, draft_vocab_size=1024, tokens_per_step=1024),
}
TTT_STEPS = 3
# Seconds an optional stage needs at least (engine start, compile, a pass over the rows); below
# that it is skipped with the reason, so that the run ends inside the budget with its JSON.
MIN_SECONDS_LEFT = {"extract_vllm": 200, "train_speculators": 120}


def versions() -> dict:
    out = {}
    for name in ("torch", "transformers", "speculators", "datasets", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


class DeviceMemory:
    """Peak memory of one stage: this process's allocator peak, and the device's used memory
    sampled in a thread (total - free: every process on the GPU, vLLM's engine included)."""

    def __init__(self, device: torch.device):
        self.device, self.peak_used, self._stop = device, 0, threading.Event()

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            free, total = torch.cuda.mem_get_info(self.device)
            self.peak_used = max(self.peak_used, total - free)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self._stop.set()
            self._thread.join()
            torch.cuda.synchronize(self.device)

    def figures(self) -> dict:
        if self.device.type != "cuda":
            return {"peak_gpu_memory_allocated_bytes": None, "peak_gpu_memory_used_bytes": None}
        return {"peak_gpu_memory_allocated_bytes": torch.cuda.max_memory_allocated(self.device),
                "peak_gpu_memory_used_bytes": self.peak_used}


def build_target(work: Path, shape: dict, device: torch.device, seed: int) -> tuple[Path, Path, dict]:
    """(target dir with config, random weights and tokenizer; the demo chats; what was built)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.stages.demo.assets import _save_tokenizer, train_demo_tokenizer
    from workers.stages.demo.chats import read_chat_messages, write_demo_chats

    started = time.perf_counter()
    target_dir, chats_path = work / "target", work / "demo-chats.jsonl"
    write_demo_chats(chats_path, num_conversations=shape["demo_conversations"], seed=seed)
    tokenizer = train_demo_tokenizer(read_chat_messages(chats_path))
    # The demo's own writer: a tokenizer config that transformers 4.x and 5.x (and vLLM) all read.
    _save_tokenizer(tokenizer, target_dir)
    config = LlamaConfig(
        vocab_size=max(shape["vocab_size"], len(tokenizer)), hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"], num_key_value_heads=shape["num_key_value_heads"],
        max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    # Initialised on the GPU (seconds, where the CPU takes a minute for 1B parameters) and stored in
    # the dtype the stages load it in there.
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    params = sum(p.numel() for p in model.parameters())
    flops = target_forward_flops_per_token(model)
    model.save_pretrained(target_dir, safe_serialization=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    info = {"params": params, "forward_flops_per_token": flops, "tokenizer_tokens": len(tokenizer),
            "build_s": round(time.perf_counter() - started, 2),
            **{k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "intermediate_size", "vocab_size")}}
    return target_dir, chats_path, info


def write_long_chats(path: Path, target_dir: Path, demo_chats: Path, shape: dict, seed: int) -> None:
    """Single-reply chats of min..max tokens (uniform), their texts drawn from the demo chats:
    one prepared row each, about 1/8 prompt and 7/8 reply."""
    from workers.stages.demo.chats import read_chat_messages
    from workers.stages.prepare import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    texts = [m["content"] for chat in read_chat_messages(demo_chats) for m in chat]
    counts = [len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]  # +1: the "\n"
    rng = random.Random(seed)

    def draw(budget: int) -> str:
        picked, used = [], 0
        while used < budget:
            i = rng.randrange(len(texts))
            picked.append(texts[i])
            used += counts[i]
        return "\n".join(picked)

    with path.open("w", encoding="utf-8") as f:
        for row in range(shape["rows"]):
            want = rng.randint(shape["min_tokens"], shape["max_tokens"]) - 16  # room for the template's tokens
            messages = [{"role": "user", "content": draw(want // 8)},
                        {"role": "assistant", "content": draw(want - want // 8)}]
            f.write(json.dumps({"id": f"gpu-check-{row:05d}", "messages": messages}) + "\n")


def call_with(fn, available: dict):
    """Call fn with the arguments it names among `available`; a required one missing is a reason."""
    params = inspect.signature(fn).parameters
    missing = [n for n, p in params.items() if p.default is p.empty and p.kind is p.KEYWORD_ONLY and n not in available]
    if missing:
        raise TypeError(f"{fn.__module__}.{fn.__name__} needs {missing}, which this check does not know how to give")
    return fn(**{k: v for k, v in available.items() if k in params})


def optional_stage(module: str, function: str, needs: str | None) -> tuple[object | None, str | None]:
    """(the stage function, None) or (None, why it cannot run here)."""
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError as exc:
            return None, f"{needs} does not import here ({exc})"
    try:
        return getattr(importlib.import_module(module), function), None
    except (ImportError, AttributeError) as exc:
        return None, f"{module}.{function} is not available in this checkout ({exc})"


def main() -> None:  # noqa: C901 - one straight run of stages, each measured the same way
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true", help="a small target and few short rows (CPU-sized)")
    parser.add_argument("--rows", type=int, default=None, help="chats to build (default: 256 full, 24 tiny)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1), help="torch intra-op threads")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="optional stages are skipped when they would end past this many seconds")
    parser.add_argument("--skip", default="", help="comma-separated optional stages to leave out: extract_vllm,train_speculators")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a new temporary directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(args.threads)

    from workers.stages.device import device_label, resolve_device
    from workers.stages.extract.with_transformers import extract
    from workers.stages.prepare import prepare
    from workers.contract.target import default_layer_ids
    from workers.stages.train.loop import build_draft_model, train
    from workers.stages.vocab import build_vocab

    device = resolve_device(args.device)
    shape = dict(SHAPES["tiny" if args.tiny else "full"])
    if args.rows:
        shape["rows"] = args.rows
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak, peak_source = bf16_peak(gpu)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    report = {
        "gpu": gpu, "device": device_label(device), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "mode": "tiny" if args.tiny else "full", "versions": versions(), "torch_threads": torch.get_num_threads(),
        "bf16_dense_peak_tflops": peak, "bf16_peak_source": peak_source,
        "fraction_of_peak_null_reason": None if peak else peak_source,
        "work_dir": str(work), "target": None, "draft": None, "data": None, "stages": {}, "total_wall_s": None,
        "peak_rss_bytes": None,
    }

    def save() -> None:
        report["total_wall_s"] = round(time.perf_counter() - started, 2)
        report["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        (work / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")

    def record(name: str, wall: float, memory: DeviceMemory, tokens: int, tokens_per_s: float | None,
               flops_per_token: int | None, **extra) -> None:
        tflops, fraction = achieved(flops_per_token, tokens_per_s, peak) if flops_per_token else (None, None)
        report["stages"][name] = {
            "wall_s": round(wall, 3), "tokens": tokens,
            "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None,
            **memory.figures(), "flops_per_token": flops_per_token, "achieved_tflops": tflops,
            "fraction_of_bf16_peak": fraction, **extra}
        save()
        print(f"gpu_check: {name} done in {wall:.1f} s", file=sys.stderr, flush=True)

    def skipped(name: str, reason: str) -> None:
        report["stages"][name] = {"skipped": reason}
        save()
        print(f"gpu_check: {name} skipped: {reason}", file=sys.stderr, flush=True)

    def time_left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    target_dir, demo_chats, report["target"] = build_target(work / "assets", shape, device, args.seed)
    save()
    layer_ids = default_layer_ids(shape["num_hidden_layers"])
    chats = work / "assets" / "long-chats.jsonl"
    write_long_chats(chats, target_dir, demo_chats, shape, args.seed)

    with DeviceMemory(device) as mem:
        t0 = time.perf_counter()
        prep = prepare(tokenizer_dir=target_dir, dataset_path=chats, out_dir=work / "prepared",
                       max_seq_len=shape["max_tokens"] + 64)
        wall = time.perf_counter() - t0
    report["data"] = {"rows": prep.num_rows, "tokens": prep.total_tokens, "loss_tokens": prep.loss_tokens,
                      "truncated_rows": prep.num_truncated_rows, "max_seq_len": prep.max_seq_len}
    record("prepare", wall, mem, prep.total_tokens, prep.total_tokens / wall, None)

    flops_target = report["target"]["forward_flops_per_token"]
    with DeviceMemory(device) as mem:
        t0 = time.perf_counter()
        ext = extract(target_dir=target_dir, prepared_dir=prep.out_dir, out_dir=work / "extract-transformers",
                      layer_ids=layer_ids, device=str(device))
        wall = time.perf_counter() - t0
    record("extract_transformers", wall, mem, ext.total_tokens, ext.tokens_per_second, flops_target,
           model_load_s=round(ext.model_load_seconds, 3), forward_s=round(ext.forward_seconds, 3),
           bytes_on_disk=ext.bytes_on_disk, layer_ids=layer_ids,
           tokens_per_s_is="tokens over the forward time (forwards and copies to the CPU; model load and file writes excluded)")

    with DeviceMemory(device) as mem:
        t0 = time.perf_counter()
        vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=work / "vocab",
                            draft_vocab_size=shape["draft_vocab_size"], target_vocab_size=report["target"]["vocab_size"])
        wall = time.perf_counter() - t0
    record("vocab", wall, mem, prep.loss_tokens, None, None, draft_vocab_size=vocab.draft_vocab_size,
           coverage=round(vocab.coverage, 4))

    draft = build_draft_model(target_dir=target_dir, layer_ids=layer_ids, d2t_path=vocab.d2t_path,
                              t2d_path=vocab.t2d_path, draft_vocab_size=vocab.draft_vocab_size, ttt_steps=TTT_STEPS)
    flops_draft = draft_train_flops_per_token(draft, TTT_STEPS)
    report["draft"] = {"params": sum(p.numel() for p in draft.parameters()),
                       "trainable_params": sum(p.numel() for p in draft.parameters() if p.requires_grad),
                       "train_flops_per_token": flops_draft, "ttt_steps": TTT_STEPS}
    del draft
    train_args = dict(target_dir=target_dir, prepared_dir=prep.out_dir, hidden_states_dir=ext.hidden_states_dir,
                      d2t_path=vocab.d2t_path, t2d_path=vocab.t2d_path, layer_ids=layer_ids, epochs=args.epochs,
                      lr=3e-4, ttt_steps=TTT_STEPS, draft_vocab_size=vocab.draft_vocab_size,
                      max_tokens_per_step=shape["tokens_per_step"], device=str(device))
    with DeviceMemory(device) as mem:
        t0 = time.perf_counter()
        trained = train(out_dir=work / "train", **train_args)
        wall = time.perf_counter() - t0
    record("train", wall, mem, trained.train_tokens, trained.tokens_per_second, flops_draft, steps=trained.steps,
           tokens_per_step=trained.tokens_per_step, final_val_loss=trained.checkpoints[-1].val_loss,
           tokens_per_s_is="tokens over the training steps' time (validation and checkpoints excluded)")

    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    optional = [("extract_vllm", "workers.stages.extract.with_vllm", "extract_with_vllm", "vllm"),
                ("train_speculators", "workers.stages.train.with_speculators.trainer", "train_with_speculators", None)]
    for name, module, function, needs in optional:
        if name in skip:
            skipped(name, "left out with --skip")
            continue
        if device.type != "cuda":
            skipped(name, f"needs a GPU; this run is on {device}")
            continue
        if time_left() < MIN_SECONDS_LEFT[name]:
            skipped(name, f"{time_left():.0f} s of the {args.budget_s:.0f} s budget left, under the "
                          f"{MIN_SECONDS_LEFT[name]} s this stage is given")
            continue
        fn, reason = optional_stage(module, function, needs)
        if fn is None:
            skipped(name, reason)
            continue
        # The server's start may take what is left of the budget but the time for the rows.
        available = (dict(target_dir=target_dir, prepared_dir=prep.out_dir, out_dir=work / name, layer_ids=layer_ids,
                          tensor_parallel_size=1, startup_timeout_s=max(60.0, time_left() - 90))
                     if name == "extract_vllm" else dict(out_dir=work / name, num_gpus=1, **train_args))
        torch.cuda.empty_cache()  # vLLM sizes its cache from the memory free when it starts
        try:
            with DeviceMemory(device) as mem:
                t0 = time.perf_counter()
                result = call_with(fn, available)
                wall = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - an optional backend's failure is a figure of the check
            report["stages"][name] = {"failed": f"{type(exc).__name__}: {exc}"[:2000]}
            save()
            print(f"gpu_check: {name} failed: {exc}", file=sys.stderr, flush=True)
            continue
        tokens = getattr(result, "total_tokens", None) or getattr(result, "train_tokens", None) or 0
        tps = getattr(result, "tokens_per_second", None) or (tokens / wall if wall else None)
        record(name, wall, mem, tokens, tps, flops_target if name == "extract_vllm" else flops_draft)

    save()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
