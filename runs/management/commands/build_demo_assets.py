"""Build the offline demo target (tokenizer + small Llama) and its chat dataset."""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Write a demo chat dataset, train a tokenizer and a small Llama target on it (offline, CPU)."

    def add_arguments(self, parser):
        parser.add_argument("out_dir", type=Path)
        parser.add_argument("--conversations", type=int, default=None, help="how many chats to generate")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print the result as one JSON line")

    def handle(self, *args, out_dir: Path, conversations: int | None, as_json: bool, **opts):
        from workers.stages.demo_assets import build_demo_assets

        logging.getLogger("workers").setLevel(logging.INFO)
        kwargs = {"num_conversations": conversations} if conversations else {}
        assets = build_demo_assets(out_dir.resolve(), **kwargs)
        result = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(assets).items()}
        if as_json:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(f"demo target: {result['target_dir']}\ndemo chats:  {result['chats_path']}")
