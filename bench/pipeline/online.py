"""Benchmark (not a test): training offline (extract every row with vLLM, then train) against online
(train while a vLLM capture server produces each row's hidden states, kept in a bounded cache).

    .venv/bin/python bench/pipeline/online.py --json [--conversations 300] [--epochs 2] [--cache-fraction 0.08]
                                     [--threads 1] [--work-dir DIR]

Both sides do the same work on the same rows and seed: one `vllm serve` (this host's build: the CPU
one here) captures the hidden states of every row at the demo's layers, and our loop trains the
same draft for --epochs. Offline's wall time covers its extraction (server start included) and its
training; online's covers its training, whose start includes the capture server's. Peak disk:
offline, the extraction's hidden states; online, the cache folder's bytes sampled every 20 ms
(capture files in flight included). The cache limit is --cache-fraction of what the offline
extraction holds. Prints offline and online figures and their ratios, measured side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from workers.contract.target import default_layer_ids, read_target_config  # noqa: E402
from workers.contract.host.vllm_env import vllm_install  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from workers.stages.extract.with_vllm import extract_with_vllm  # noqa: E402
from workers.stages.prepare.stage import prepare  # noqa: E402
from workers.stages.train.loop import train  # noqa: E402
from workers.stages.train.online.source import OnlineSource  # noqa: E402
from workers.stages.vocab import build_vocab  # noqa: E402


class FolderPeak(threading.Thread):
    """A folder's bytes of hidden-state files (`pattern` under it: by default every *.safetensors* file at any
    depth, the capture servers' and the .part copies included), sampled every 20 ms until `done` is set;
    `peak` the largest (tests/stages/train/online/test_online_*.py and tests/e2e/vllm/test_online_run.py sample caches
    with it too)."""

    def __init__(self, folder: Path, *, pattern: str = "**/*.safetensors*"):
        super().__init__(daemon=True)
        self.folder, self.pattern, self.peak, self.done = folder, pattern, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            sizes = {}  # by inode: a file renamed from a server's folder into the cache mid-walk counts once
            for path in self.folder.glob(self.pattern):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                sizes[(stat.st_dev, stat.st_ino)] = stat.st_size
            self.peak = max(self.peak, sum(sizes.values()))
            time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cache-fraction", type=float, default=0.08)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work-dir", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install = vllm_install()
    if isinstance(install, str):
        raise SystemExit(f"needs vLLM (`make vllm`): {install}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-online-"))
    assets = build_demo_assets(work / "assets", num_conversations=args.conversations, train_steps=12, seed=0)
    target = read_target_config(assets.target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    prep = prepare(tokenizer_dir=assets.target_dir, dataset_path=assets.chats_path, out_dir=work / "prepared",
                   max_seq_len=512)
    vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=work / "vocab",
                        draft_vocab_size=min(512, target.vocab_size), target_vocab_size=target.vocab_size)
    common = dict(target_dir=assets.target_dir, prepared_dir=prep.out_dir, d2t_path=vocab.d2t_path,
                  t2d_path=vocab.t2d_path, layer_ids=layer_ids, epochs=args.epochs, lr=3e-4, ttt_steps=3,
                  draft_vocab_size=vocab.draft_vocab_size, seed=0, device="cpu")

    started = time.perf_counter()
    extraction = extract_with_vllm(target_dir=assets.target_dir, prepared_dir=prep.out_dir,
                                   out_dir=work / "extraction", layer_ids=layer_ids,
                                   vllm_executable=install.executable)
    extract_seconds = time.perf_counter() - started
    offline_train = train(**common, hidden_states_dir=extraction.hidden_states_dir, out_dir=work / "offline")
    offline_seconds = time.perf_counter() - started
    offline_bytes = sum(p.stat().st_size for p in extraction.hidden_states_dir.glob("hs_*.safetensors"))

    limit = int(offline_bytes * args.cache_fraction)
    cache_dir = work / "cache"
    peak = FolderPeak(cache_dir)
    peak.start()
    started = time.perf_counter()
    try:
        online_train = train(**common, hidden_states_dir=None, out_dir=work / "online",
                             online=OnlineSource(cache_dir=cache_dir, cache_bytes=limit, capture_servers=1,
                                                 vllm_executable=install.executable))
    finally:
        peak.done.set()
        peak.join()
    online_seconds = time.perf_counter() - started
    supply = online_train.supply
    hit_rates = supply["cache_hit_rate_per_epoch"]
    report = {
        "rows": prep.num_rows, "tokens": prep.total_tokens,
        "epochs": args.epochs, "threads": args.threads, "vllm": install.version,
        "offline": {"wall_seconds": round(offline_seconds, 1), "extract_seconds": round(extract_seconds, 1),
                    "server_start_seconds": round(extraction.model_load_seconds, 1),
                    "peak_disk_bytes": offline_bytes,
                    "trainer_tokens_per_s": round(offline_train.tokens_per_second, 1),
                    "fetch_wait_fraction": round(offline_train.supply["fetch_wait_fraction"], 4)},
        "online": {"wall_seconds": round(online_seconds, 1), "peak_disk_bytes": peak.peak,
                   "server_start_seconds": round(supply["servers_startup_seconds"], 1),
                   "cache_limit_bytes": limit, "trainer_tokens_per_s": round(online_train.tokens_per_second, 1),
                   "fetch_wait_fraction": round(supply["fetch_wait_fraction"], 4),
                   "capture_tokens_per_s": round(supply["capture_tokens_per_s"] or 0.0, 1),
                   "cache_hit_rate_epoch_2": round(hit_rates[1], 4) if len(hit_rates) > 1 else None,
                   "cache_hit_rate_per_epoch": [round(r, 4) for r in hit_rates],
                   "bound": supply["bound"], "advice": supply["advice"]},
    }
    report["ratios"] = {"peak_disk_online_over_offline": round(peak.peak / offline_bytes, 4),
                        "wall_online_over_offline": round(online_seconds / offline_seconds, 3),
                        # vLLM's start swings by a minute on a shared box: the same ratio without it on either side
                        "wall_without_server_start": round(
                            (online_seconds - supply["servers_startup_seconds"])
                            / (offline_seconds - extraction.model_load_seconds), 3)}
    report["targets_met"] = {"peak_disk_at_most_10_percent": report["ratios"]["peak_disk_online_over_offline"] <= 0.10,
                             "wall_at_most_1.3x": report["ratios"]["wall_online_over_offline"] <= 1.3}
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
