"""The whole curves' build, the old JSON writing and the new side by side in one process (issue 40): not a test.

    .venv/bin/python bench/tracker/curve_json_ab.py --rounds 30 --json [--profile]

Makes a scratch PostgreSQL database (`bench_curve_json`, dropped at the end) with two runs written through the
workers' write path (runs.tracking.services.metrics_record): one with 12 train series (loss_0..5, acc_0..5) of
1,500 points, 20 steps a batch as bench/load's writer flushes them; one with a series of 1,000,000 points
(bench/tracker/metrics.py's curve, batches of 10,000). Then, alternately, `--rounds` times each, the build that
runs.tracking.curve_api.run_metrics caches: old, `live.json_bytes` of curves.curve_window (the columns as Python
lists, json.dumps: the code before this change), and new, curve_api.window_json of curves.curve_window_columns;
each read + JSON, and the JSON alone on the same read, plus gzip at level 1 as runs.live does. Checks that both
give the same bytes. Prints the median and p95 ms, the bytes plain and gzipped, and the 1-minute load.
--profile: cProfile of 20 old and 20 new builds of the 12 series, the top functions by own time, to stderr.
"""
from __future__ import annotations

import argparse
import cProfile
import gzip
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tracker.scratch_site import drop_database, make_runs, recreate_database, setup_django, stats  # noqa: E402

DATABASE = "bench_curve_json"
KEYS = [f"{name}_{i}" for name in ("loss", "acc") for i in range(6)]


def build_runs() -> list[int]:
    from bench.tracker.metrics import batches
    from runs.tracking.services import metrics_record

    _, _, training = make_runs(2, workdir=Path(tempfile.mkdtemp(prefix="bench-curve-json-")))
    for lo in range(0, 1500, 20):
        metrics_record(training_run_id=training[0].pk, points=[
            {"split": "train", "key": key, "step": s * 10, "epoch": s / 700, "value": 2.0 / (1 + s / 300) + k * 0.01}
            for s in range(lo, lo + 20) for k, key in enumerate(KEYS)])
    for steps, values in batches(1_000_000, 10_000, seed=0):
        metrics_record(training_run_id=training[1].pk, points=[
            {"split": "train", "key": "loss", "step": int(s), "epoch": float(s) / 1_000_000 * 3, "value": float(v)}
            for s, v in zip(steps, values)])
    return [t.pk for t in training]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    setup_django(recreate_database(DATABASE))
    try:
        from runs import live
        from runs.tracking import curves
        from runs.tracking.curve_api import window_json

        twelve, million = build_runs()
        cases = {"12x1500": (twelve, curves.CurveQuery()),
                 "1M": (million, curves.CurveQuery(keys=("loss",), split="train", points=2000))}
        out = {"load_1min_before": os.getloadavg()[0], "rounds": args.rounds}
        for name, (training_id, query) in cases.items():
            head = {"run": training_id, "start": query.start, "end": query.end, "points": query.points}

            def old():
                return live.json_bytes({**head, "series": curves.curve_window(training_run_id=training_id, query=query)})

            def new():
                return window_json(head, curves.curve_window_columns(training_run_id=training_id, query=query))

            assert old() == new(), name
            columns = curves.curve_window_columns(training_run_id=training_id, query=query)
            lists = curves.curve_window(training_run_id=training_id, query=query)
            steps = {"old": old, "new": new,
                     "old_json_only": lambda: live.json_bytes({**head, "series": lists}),
                     "new_json_only": lambda: window_json(head, columns)}
            times = {k: [] for k in steps}
            for _ in range(args.rounds):
                for k, step in steps.items():
                    t0 = time.perf_counter()
                    step()
                    times[k].append((time.perf_counter() - t0) * 1000)
            body = new()
            t0 = time.perf_counter()
            packed = gzip.compress(body, compresslevel=1, mtime=0)
            out[name] = {**{f"{k}_ms": [round(x, 2) for x in stats(v)] for k, v in times.items()},
                         "gzip_ms": round((time.perf_counter() - t0) * 1000, 2), "bytes": len(body),
                         "gzip_bytes": len(packed), "same_bytes": old() == new()}
            for side, build in (("old", old), ("new", new)) if args.profile and name == "12x1500" else ():
                profile = cProfile.Profile()
                profile.runcall(lambda: [build() for _ in range(20)])
                print(f"--- {side}: 20 builds of {name}", file=sys.stderr)
                pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(10)
        out["load_1min_after"] = os.getloadavg()[0]
        print(json.dumps(out, indent=None if args.json else 2))
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(DATABASE)


if __name__ == "__main__":
    main()
