"""`eagle3web datasets regenerate DATASET --target TARGET [...]`: a dataset's replies written again by a target
(a regeneration, docs/runs/on-policy.md), with its `--shards`, from a shell.

TARGET is the target's id, or its folder or name on the server as GET /api/v1/targets/ lists them. Without
--json: "regeneration 7 of dataset 3 (chats.jsonl): queued, 2 shards" (the stored job's state, "already asked"
when these settings made or are making it already)."""
from __future__ import annotations

import argparse
from typing import Any

from eagle3web_client.client import Client

REGENERATE_INTS = ("max_new_tokens", "seed", "max_samples", "shards")


def add_parsers(groups: argparse._SubParsersAction) -> None:
    datasets = groups.add_parser("datasets", help="datasets").add_subparsers(dest="command", required=True)
    regenerate = datasets.add_parser("regenerate", help="have a target write the dataset's replies again")
    regenerate.add_argument("dataset_id", type=int)
    regenerate.add_argument("--target", required=True, help="the target's id, or its folder or name on the server")
    regenerate.add_argument("--backend", help="auto (default), vllm or transformers")
    regenerate.add_argument("--temperature", type=float, help="0 (default) is greedy")
    for name in REGENERATE_INTS:
        regenerate.add_argument(f"--{name.replace('_', '-')}", type=int)


def dataset_command(client: Client, args: argparse.Namespace) -> Any:
    options = {name: getattr(args, name) for name in ("backend", "temperature", *REGENERATE_INTS)}
    return client.datasets.regenerate(args.dataset_id, target=args.target, **options)


def dataset_text(args: argparse.Namespace, answer: dict) -> tuple[str, str]:
    """(stdout, stderr) without --json."""
    job = answer["regeneration"]
    name = f" ({job['dataset_name']})" if job.get("dataset_name") else ""
    shards = job.get("shards")
    split = f", {shards} shard{'s' if shards != 1 else ''}" if shards else ", shards: one per live worker"
    asked = "" if answer.get("queued") else " (already asked with these settings)"
    return f"regeneration {job['regeneration_id']} of dataset {job['dataset_id']}{name}: {job['status']}{split}{asked}", ""
