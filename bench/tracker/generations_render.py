"""Benchmark (not a test): the checkpoint page's generations table for 32 prompts, drawn in headless Chromium.

    .venv/bin/python bench/tracker/generations_render.py --json

The replies are decoded for real: the demo's tiny target (built here, offline) answers its first --prompts
chat prompts with up to --max-new-tokens tokens each, speculatively, with the stand-in drafts of
tests/helpers/generations.py (epoch 0: right at draft position 1 only; epoch 1: the target's own continuation),
and the evaluate stage's recording stores them (PostgreSQL database `bench_generations`, created and
dropped here). The page is served by `manage.py runserver`; each of --loads loads of the checkpoint page
reads the performance measure "generations-render" that static/js/runs/generations.js records for its draw
(building the rows, the legend and the filter pass, up to the layout they cause; replies out of view are
laid out when scrolled near, CSS content-visibility), then the same after choosing the other checkpoint
to compare with (twice the replies). The target is 200 ms (issue 28), p95 over the loads."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
os.environ.setdefault("EAGLE3WEB_VLLM_PREFLIGHT_SECONDS", "0")  # the launch's vLLM check: no vLLM is served here

from bench.tracker.scratch_site import drop_database, free_port, make_runs, recreate_database, setup_django, stats  # noqa: E402
from bench.tracker.web_server import runserver  # noqa: E402

DATABASE = "bench_generations"
TARGET_MS = 200


def measure_checkpoints(workdir: Path, args) -> tuple[object, object, dict]:
    """The run, its two checkpoints with their generations recorded, and what was decoded."""
    from workers.stages.demo.assets import build_demo_assets

    from runs.models import Checkpoint, TrainingRun
    from tests.helpers.generations import measured, record

    assets = build_demo_assets(Path(args.assets), num_conversations=150, train_steps=12, seed=0)
    _user, runs, training = make_runs(1, workdir=workdir)
    run = runs[0]
    checkpoints = [Checkpoint.objects.create(training_run=training[0], epoch=e, path=str(workdir / f"ckpt-{e}"),
                                             is_best=e == 1) for e in (0, 1)]
    TrainingRun.objects.filter(pk=training[0].pk).update(status="succeeded", best_epoch=1)
    decoded = {}
    for checkpoint, proposer in zip(checkpoints, ("first", "oracle")):
        found = measured(assets, proposer, prompts=args.prompts, max_new_tokens=args.max_new_tokens)
        record(stage=run.evaluation, checkpoint=checkpoint, found=found)
        decoded[proposer] = {"prompts": len(found.table["prompts"]),
                             "tokens": sum(len(p["ids"]) for p in found.table["prompts"]), "tau": found.measurement.tau}
    return run, checkpoints, decoded


def render_times(base: str, checkpoints, args) -> dict:
    from playwright.sync_api import sync_playwright

    page_url = f"{base}/checkpoints/{checkpoints[0].pk}/"
    own, compared = [], []
    with sync_playwright() as p:
        chrome = p.chromium.launch(executable_path="/usr/bin/chromium",
                                   args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = chrome.new_page(viewport={"width": 1400, "height": 2000})
        page.goto(base + "/login/")
        page.fill("#id_username", "bench")
        page.fill("#id_password", "bench-password-1")
        page.click("button[type=submit]")
        read = "() => performance.getEntriesByName('generations-render').map(e => e.duration)"
        for _ in range(args.loads):
            page.goto(page_url)
            try:
                page.wait_for_selector('#generations[data-rendered="drawn"]', timeout=60_000)
            except Exception:
                found = page.query_selector("#generations-status")
                status = found.text_content() if found else None
                sys.exit(f"the table was not drawn at {page.url}: {status!r}")
            own.append(page.evaluate(read)[-1])
            page.select_option("#generations-compare", str(checkpoints[1].pk))
            page.wait_for_selector('#generations[data-rendered="compared"]', timeout=60_000)
            compared.append(page.evaluate(read)[-1])
        tokens = page.evaluate("document.querySelectorAll('#generations-table .tok').length")
        chrome.close()
    return {"own": own, "compared": compared, "tokens_drawn_compared": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--assets", default=str(Path(tempfile.gettempdir()) / "eagle3web-bench-generations-assets"),
                        help="where the tiny target is built, and reused by the next run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    url = recreate_database(DATABASE)
    setup_django(url)
    from django.contrib.auth import get_user_model
    from django.db import connections

    workdir = Path(tempfile.mkdtemp(prefix="bench-generations-"))
    try:
        run, checkpoints, decoded = measure_checkpoints(workdir, args)
        user = get_user_model().objects.get(username="bench")
        user.set_password("bench-password-1")
        user.save()
        connections.close_all()
        port = free_port()
        env = {**os.environ, "DATABASE_URL": url, "EAGLE3WEB_DATA_ROOTS": str(workdir)}
        with runserver(port=port, env=env) as base:
            times = render_times(base, checkpoints, args)
    finally:
        connections.close_all()
        drop_database(DATABASE)
        shutil.rmtree(workdir, ignore_errors=True)
    own_median, own_p95 = stats(times["own"])
    compared_median, compared_p95 = stats(times["compared"])
    out = {
        "prompts": decoded["first"]["prompts"], "reply_tokens": decoded["first"]["tokens"],
        "tau": {"epoch_0": round(decoded["first"]["tau"], 3), "epoch_1": round(decoded["oracle"]["tau"], 3)},
        "loads": args.loads, "render_ms_median": round(own_median, 1), "render_ms_p95": round(own_p95, 1),
        "compared_render_ms_median": round(compared_median, 1), "compared_render_ms_p95": round(compared_p95, 1),
        "compared_tokens_drawn": times["tokens_drawn_compared"], "target_ms": TARGET_MS,
        "within_target": own_p95 <= TARGET_MS and compared_p95 <= TARGET_MS,
        "render_ms_each_load": [round(t, 1) for t in times["own"]],
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
