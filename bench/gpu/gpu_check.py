"""GPU check (not a test): the pipeline's stages on a randomly initialised ~1B Llama target, on one GPU.

    bench/gpu/gpu_check.sh                      # sets Python up when needed, runs this under `timeout 480`
    bench/gpu/gpu_check.sh --device cpu --tiny  # the same code path on a small model, on this CPU

Built offline, nothing fetched (bench/gpu/gpu_check_data.py): a BPE tokenizer trained on the demo's
procedural chats, a Llama-architecture target with random weights (hidden 2048, 16 layers, 32 heads /
8 KV heads, intermediate 8192, vocabulary 32,000: 1.1B parameters), and single-reply chats of
1,024-2,048 tokens made from the demo chats' texts. Then the stages' own functions, with no Django and
no database: prepare -> forward_bare (the extraction's batches without capture, the baseline; run
before and after the extraction, the second counted) -> extract (transformers) -> vocab -> train (our
loop) -> train_kimi_width (bench/gpu/gpu_check_kimi.py), and, when there is time left and a GPU, extract
with vLLM (when vllm imports) and train with speculators' Trainer. The optional stages run last so
that a slow engine start cannot cost the core figures.

Prints one JSON object: GPU, date, and per stage the wall time, tokens/s, peak memory (on CUDA
torch.cuda.max_memory_allocated of this process, reset per stage, and the device's peak used memory
sampled every 50 ms, which also sees vLLM's and torchrun's processes; on the CPU the process's peak
resident memory in the stage, and its rise above the stage's start), achieved TFLOP/s and its fraction
of the GPU's dense bf16 peak (bench/gpu/gpu_peaks.py says how FLOPs are counted), compiles, recompiles
and the time split; plus extract_vs_bare and train_vs_speculators. The same object is rewritten to
WORK/gpu_check.json after every stage, so that a run cut short still leaves its figures.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata
import inspect
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from gpu_check_data import build_target, write_long_chats  # noqa: E402
from gpu_peaks import achieved, bf16_peak, draft_train_flops_per_token  # noqa: E402

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
# speculators 0.9's fused loss fails under dynamo with torch 2.11 ("ListVariable ... already tracked for
# mutation"); its compiled forward with the eager loss is what runs there.
SPECULATORS_CHECK_ARGS = ["--loss-implementation", "eager"]
MIN_SECONDS_LEFT = {"extract_vllm": 200, "train_speculators": 120, "train_kimi_width": 60}


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
        if self.device.type != "cuda":
            with open("/proc/self/clear_refs", "w") as f:  # Linux: resets VmHWM, the peak resident size
                f.write("5")
            self.rss_start = _status_bytes("VmRSS")
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
            # The kernel's resident counters are per-CPU approximations (a few hundred KiB apart), so
            # a stage that reuses freed heap can read a peak a little below its start: the rise floors at 0.
            peak = _status_bytes("VmHWM")
            return {"peak_memory_bytes": peak,
                    "peak_memory_is": "the process's peak resident memory in the stage (CPU)",
                    "peak_memory_above_start_bytes": max(0, peak - self.rss_start),
                    "peak_gpu_memory_allocated_bytes": None, "peak_gpu_memory_used_bytes": None}
        allocated = torch.cuda.max_memory_allocated(self.device)
        return {"peak_memory_bytes": allocated, "peak_memory_is": "torch.cuda.max_memory_allocated in the stage",
                "peak_gpu_memory_allocated_bytes": allocated, "peak_gpu_memory_used_bytes": self.peak_used}


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


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
    parser.add_argument("--skip", default="",
                        help="comma-separated optional stages to leave out: train_kimi_width,extract_vllm,train_speculators")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="the training budget (default: 8,192 full, 1,024 tiny)")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a new temporary directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(args.threads)

    from workers.stages.device import device_label, resolve_device
    from workers.stages.extract.with_transformers import extract
    from workers.stages.prepare.stage import prepare
    from workers.contract.target import default_layer_ids
    from workers.stages.train.draft.model import build_draft_model
    from workers.stages.train.loop import train
    from workers.stages.vocab import build_vocab
    from workers.stages.train.step.stepper import compiled_graphs

    device = resolve_device(args.device)
    shape = dict(SHAPES["tiny" if args.tiny else "full"])
    if args.rows:
        shape["rows"] = args.rows
    if args.tokens_per_step:
        shape["tokens_per_step"] = args.tokens_per_step
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak, peak_source = bf16_peak(gpu)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    report = {
        "gpu": gpu, "device": device_label(device), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "mode": "tiny" if args.tiny else "full", "versions": versions(), "torch_threads": torch.get_num_threads(),
        "bf16_dense_peak_tflops": peak, "bf16_peak_source": peak_source,
        "fraction_of_peak_null_reason": None if peak else peak_source,
        "extract_vs_bare": None, "train_vs_speculators": None,
        "work_dir": str(work), "target": None, "draft": None, "data": None, "stages": {}, "total_wall_s": None,
        "peak_rss_bytes": None,
    }

    def save() -> None:
        report["total_wall_s"] = round(time.perf_counter() - started, 2)
        report["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        (work / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")

    def record(name: str, wall: float, memory: DeviceMemory, tokens: int, tokens_per_s: float | None,
               flops_per_token: int | None, graphs_before: int | None = None, **extra) -> None:
        tflops, fraction = achieved(flops_per_token, tokens_per_s, peak) if flops_per_token else (None, None)
        extra.setdefault("compiles", None if graphs_before is None else compiled_graphs() - graphs_before)
        extra.setdefault("recompiles", None)
        extra.setdefault("time_split_s", None)
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
    # The baseline does the same work but the capture: the same model, batches and layers run, no copies or
    # writes. It runs before the extraction too, so that neither pays the GPU's first-use costs alone; the
    # ratio takes the run after.
    bare_fn, bare_reason = optional_stage("workers.stages.extract.with_transformers", "bare_forward", None)

    def bare_run() -> tuple[dict, float, DeviceMemory]:
        with DeviceMemory(device) as memory:
            started_at = time.perf_counter()
            result = call_with(bare_fn, dict(target_dir=target_dir, prepared_dir=prep.out_dir, layer_ids=layer_ids,
                                             device=str(device)))
        return result, time.perf_counter() - started_at, memory

    bare_cold = bare_run()[0] if bare_fn is not None else None
    with DeviceMemory(device) as mem:
        t0 = time.perf_counter()
        ext = extract(target_dir=target_dir, prepared_dir=prep.out_dir, out_dir=work / "extract-transformers",
                      layer_ids=layer_ids, device=str(device))
        wall = time.perf_counter() - t0
    record("extract_transformers", wall, mem, ext.total_tokens, ext.tokens_per_second, flops_target,
           model_load_s=round(ext.model_load_seconds, 3), forward_s=round(ext.forward_seconds, 3),
           bytes_on_disk=ext.bytes_on_disk, layer_ids=layer_ids, time_split_s=getattr(ext, "time_split_s", None),
           tokens_per_s_is="tokens over the forward loop's time (forwards, copies to the CPU and waits for the "
                           "writer; model load excluded)")
    if bare_fn is None:
        skipped("forward_bare", bare_reason)
    else:
        bare, wall, mem = bare_run()
        record("forward_bare", wall, mem, bare["tokens"], bare["tokens_per_s"], flops_target,
               first_run_tokens_per_s=round(bare_cold["tokens_per_s"], 1),
               **{k: v for k, v in bare.items() if k not in ("tokens", "tokens_per_s")})
        if ext.tokens_per_second and bare["tokens_per_s"]:
            report["extract_vs_bare"] = round(ext.tokens_per_second / bare["tokens_per_s"], 4)

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
        points: list[dict] = []
        trained = train(out_dir=work / "train", on_metrics=points.extend, **train_args)
        wall = time.perf_counter() - t0
    # Per step: the first steps of each padded length compile; the median step says what the loop does after.
    step_rates = sorted(p["value"] for p in points if p["split"] == "train" and p["key"] == "tokens_per_s")
    record("train", wall, mem, trained.train_tokens, trained.tokens_per_second, flops_draft, steps=trained.steps,
           tokens_per_step=trained.tokens_per_step, final_val_loss=trained.checkpoints[-1].val_loss,
           step_config=trained.step_config, step_lengths=trained.step_lengths, compiles=trained.graphs_compiled,
           recompiles=trained.recompiles, time_split_s=trained.time_split_s,
           recompiles_is="graphs compiled beyond one per padded length, TTT step and grad mode",
           tokens_per_s_median_step=round(step_rates[len(step_rates) // 2], 1) if step_rates else None,
           tokens_per_s_is="tokens over the training steps' time (validation and checkpoints excluded; "
                           "the first steps' compiles included)")

    if "train_kimi_width" in {s.strip() for s in args.skip.split(",")}:
        skipped("train_kimi_width", "left out with --skip")
    elif time_left() < MIN_SECONDS_LEFT["train_kimi_width"]:
        skipped("train_kimi_width", f"{time_left():.0f} s of the budget left")
    else:
        from gpu_check_kimi import KIMI, TINY, train_kimi_width
        if device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            with DeviceMemory(device) as mem:
                t0 = time.perf_counter()
                kimi = train_kimi_width(work / "kimi", device, steps=2 if args.tiny else 6, ttt_steps=TTT_STEPS,
                                        tokens_per_step=1024 if args.tiny else 8192, shape=TINY if args.tiny else KIMI,
                                        draft_vocab=1024 if args.tiny else 32000,
                                        layer_ids=[1, 4, 7, 8] if args.tiny else [2, 30, 58, 60])
                wall = time.perf_counter() - t0
            record("train_kimi_width", wall, mem, kimi.pop("tokens"), kimi.pop("tokens_per_s"),
                   kimi.pop("flops_per_token"), compiles=kimi.pop("graphs_compiled"), **kimi)
        except Exception as exc:  # noqa: BLE001 - a failure here is a figure of the check (out of memory, say)
            report["stages"]["train_kimi_width"] = {"failed": f"{type(exc).__name__}: {exc}"[:2000]}
            save()

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
                     if name == "extract_vllm" else dict(out_dir=work / name, num_gpus=1, **train_args,
                                                         extra_args=SPECULATORS_CHECK_ARGS))
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
        record(name, wall, mem, tokens, tps, flops_target if name == "extract_vllm" else flops_draft,
               extra_args=None if name == "extract_vllm" else SPECULATORS_CHECK_ARGS)
        if name == "train_speculators" and tps:
            report["train_vs_speculators"] = round(trained.tokens_per_second / tps, 4)

    save()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
