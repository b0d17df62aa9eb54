"""Build the offline demo target (tokenizer + small Llama) and its chat dataset: here, or (--as-job) as a
job a cpu worker runs, which `make demo` asks for so that the web server starts at once."""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Write a demo chat dataset, train a tokenizer and a small Llama target on it (offline, CPU)."

    def add_arguments(self, parser):
        parser.add_argument("out_dir", type=Path)
        parser.add_argument("--conversations", type=int, default=None, help="how many chats to generate")
        parser.add_argument("--train-steps", type=int, default=None, help="training steps of the demo target")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print the result as one JSON line")
        parser.add_argument("--as-job", action="store_true",
                            help="queue the build for a cpu worker (none if it is built already) and return at once")

    def handle(self, *args, out_dir: Path, conversations: int | None, train_steps: int | None, as_json: bool,
               as_job: bool = False, **opts):
        if as_job:
            return self._queue(out_dir, conversations, train_steps)
        from workers.stages.demo.assets import build_demo_assets

        logging.getLogger("workers").setLevel(logging.INFO)
        kwargs = {"num_conversations": conversations} if conversations else {}
        if train_steps:
            kwargs["train_steps"] = train_steps
        progress = BuildProgress(sys.stderr)
        assets = build_demo_assets(out_dir.resolve(), on_progress=progress, **kwargs)
        progress.done()
        result = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(assets).items()}
        if as_json:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(f"demo target: {result['target_dir']}\ndemo chats:  {result['chats_path']}")

    def _queue(self, out_dir: Path, conversations: int | None, train_steps: int | None) -> None:
        from runs.pipeline.jobs.services import demo_build_request
        from workers.contract.demo_build import DEFAULT_CONVERSATIONS, DEFAULT_TRAIN_STEPS

        build = demo_build_request(out_dir=out_dir, num_conversations=conversations or DEFAULT_CONVERSATIONS,
                                   train_steps=train_steps or DEFAULT_TRAIN_STEPS)
        if build is None:
            self.stdout.write(f"Demo target already built in {out_dir.resolve()}: reusing it.")
        else:
            self.stdout.write(f"Demo target: {build} is {build.status} on the cpu queue (a cpu worker builds it in "
                              "a few minutes; the launch page shows how far it is).")


class BuildProgress:
    """One line on stderr, rewritten every second: how far the build is and about how long is left
    (from the pace so far), so a first `make demo` does not look hung for the minute it trains."""

    def __init__(self, stream, interval: float = 1.0):
        self.stream, self.interval = stream, interval
        self.started = self.last = time.monotonic()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < self.interval and done < total:
            return
        self.last = now
        elapsed = now - self.started
        left = elapsed / done * (total - done) if done else None
        estimate = f", about {left:.0f} s left" if left is not None and done < total else ""
        self.stream.write(f"\rBuilding the demo target (a small Llama trained on CPU): step {done} of {total}"
                          f"{estimate}   ")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write(f"\nDemo target ready in {time.monotonic() - self.started:.0f} s.\n")
            self.stream.flush()
