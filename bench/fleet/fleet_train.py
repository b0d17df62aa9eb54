"""Our loop's training on 1 and on 2 CPU nodes (issue 36): step time and the all-reduce's share of it.

    .venv/bin/python bench/fleet/fleet_train.py [--conversations 120] [--epochs 2] [--tokens-per-step 1024] [--json]

The tiny demo target (workers.stages.demo.assets), its chats prepared, extracted and mapped by the stages
themselves. `one_node`: workers.stages.train.loop.train in this process. `two_nodes`: the same training
through workers.stages.train.processes.nodes.train_on_node twice (two torchruns, c10d rendezvous on 127.0.0.1,
gloo), as two workers on two hosts run it, each with one torch thread. Step time is the training's own
(TrainResult.seconds counts model building and validation too, so steps are timed from the training's
train seconds: tokens / tokens_per_second over its steps).

The all-reduce's share: DDP all-reduces the gradients inside backward; here the same all-reduce (one
float32 tensor of the draft's trainable parameter count, plus the loop's two small ones per step:
workers.stages.train.processes.ddp) is timed alone in a 2-process gloo group on this host, and divided by the
2-node step time. On one host the "network" is loopback: between hosts add the wire's time.
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

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from workers.contract.target import default_layer_ids, read_target_config  # noqa: E402
from workers.stages.demo.assets import build_demo_assets  # noqa: E402
from workers.stages.extract.with_transformers import extract  # noqa: E402
from workers.stages.prepare.stage import prepare  # noqa: E402
from workers.stages.train.draft.model import build_draft_model  # noqa: E402
from workers.stages.train.loop import train  # noqa: E402
from workers.stages.train.processes.nodes import NodePlace, free_port, train_on_node  # noqa: E402
from workers.stages.vocab import build_vocab  # noqa: E402

REPEATS = 30


def _allreduce_worker(rank: int, port: int, numel: int, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    grads, small = torch.ones(numel), torch.ones(8, dtype=torch.float64)
    for _ in range(3):
        dist.all_reduce(grads)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(REPEATS):
        dist.all_reduce(grads)
        dist.all_reduce(small)
        dist.all_reduce(small)
    seconds = (time.perf_counter() - start) / REPEATS
    if rank == 0:
        out["seconds"] = seconds
    dist.destroy_process_group()


def allreduce_seconds(numel: int) -> float:
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_allreduce_worker, args=(free_port(), numel, out), nprocs=2, join=True)
    return float(out["seconds"])


def _step_seconds(result) -> float:
    return result.train_tokens / max(result.tokens_per_second, 1e-9) / max(result.steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=120)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--tokens-per-step", type=int, default=1024)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-train-"))
    assets = build_demo_assets(work / "assets", num_conversations=args.conversations, train_steps=12, seed=0)
    target = read_target_config(assets.target_dir)
    layer_ids = default_layer_ids(target.num_layers)
    prep = prepare(tokenizer_dir=assets.target_dir, dataset_path=assets.chats_path, out_dir=work / "prepared",
                   max_seq_len=512)
    ext = extract(target_dir=assets.target_dir, prepared_dir=prep.out_dir, out_dir=work / "extraction",
                  layer_ids=layer_ids)
    vocab = build_vocab(token_freq_path=prep.token_freq_path, out_dir=work / "vocab",
                        draft_vocab_size=min(512, target.vocab_size), target_vocab_size=target.vocab_size)
    common = dict(target_dir=assets.target_dir, prepared_dir=prep.out_dir, hidden_states_dir=Path(ext.hidden_states_dir),
                  d2t_path=vocab.d2t_path, t2d_path=vocab.t2d_path, layer_ids=layer_ids, epochs=args.epochs, lr=3e-4,
                  ttt_steps=3, draft_vocab_size=vocab.draft_vocab_size, seed=0, device="cpu",
                  max_tokens_per_step=args.tokens_per_step)
    one = train(**common, out_dir=work / "one")

    endpoint, outcomes = f"127.0.0.1:{free_port()}", {}

    def node(rank: int) -> None:
        place = NodePlace(nodes=2, rank=rank, endpoint=endpoint, rdzv_id="bench", join_timeout=120)
        outcomes[rank] = train_on_node(place=place, watch=lambda: None, **common, out_dir=work / "two")

    started = time.perf_counter()
    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    two_wall = time.perf_counter() - started
    two = outcomes[0]
    model = build_draft_model(target_dir=assets.target_dir, layer_ids=layer_ids, d2t_path=vocab.d2t_path,
                              t2d_path=vocab.t2d_path, draft_vocab_size=vocab.draft_vocab_size, ttt_steps=3, seed=0)
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    reduce_s = allreduce_seconds(numel)
    one_step, two_step = _step_seconds(one), _step_seconds(two)
    result = {
        "rows": prep.num_rows, "steps": one.steps, "tokens_per_step": one.tokens_per_step, "epochs": args.epochs,
        "cpu_threads_per_node": 1, "host_cores": os.cpu_count(),
        "one_node": {"step_seconds": round(one_step, 4), "tokens_per_second": round(one.tokens_per_second, 1),
                     "time_split_s": one.time_split_s},
        "two_nodes": {"step_seconds": round(two_step, 4), "tokens_per_second": round(two.tokens_per_second, 1),
                      "time_split_s": two.time_split_s, "wall_seconds_with_torchrun_start": round(two_wall, 1)},
        "speedup": round(one_step / two_step, 3),
        "allreduce": {"gradient_floats": numel, "seconds_per_step": round(reduce_s, 5),
                      "share_of_two_node_step": round(reduce_s / two_step, 4)},
    }
    if not args.json:
        print(f"1 node {one_step * 1000:.1f} ms/step, 2 nodes {two_step * 1000:.1f} ms/step; all-reduce "
              f"{reduce_s * 1000:.2f} ms ({100 * reduce_s / two_step:.1f}% of a 2-node step)", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
