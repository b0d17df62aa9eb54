"""The workers' write path of two checkouts side by side (issue 40): not a test.

    EAGLE3WEB_VLLM_PREFLIGHT_SECONDS=0 .venv/bin/python bench/tracker/ingest_ab.py \\
        --checkout ../eagle3web-before --checkout . --points 200000 --json

Each checkout runs in a process of its own (its own code, on a scratch database of its own, `bench_ingest_<i>_<pid>`,
made, migrated by that checkout and dropped: the two may differ in migrations), both started first and then
driven in turns of --segment main batches, the order of the checkouts swapped every turn, so that the load of a
noisy machine falls on both alike. A process writes bench/tracker/metrics.py's ingestion: one series `train/loss`
of --points steps in batches of --batch, each main batch followed by two batches of --other-runs other runs'
series (the main series' rows are not contiguous), and times the main batches only, with their points' dicts
built inside the timed part as metrics.py's ours() does. Prints per checkout the points/s (the points over the
summed wall time of its main batches), the milliseconds per main batch (wall and the process's CPU: median and
p95; CPU also the mean), the queries per main batch, the ratio of points/s to the first checkout's, and the
1-minute load at each turn (its range and median).
--profile prints each checkout's cProfile of its main batches (cumulative, top 30) to stderr.
--api writes every batch as the API stores a client's report instead (runs.tracking.reported_points: points_check,
then points_report inside a transaction of its own, as runs.pipeline.launch.external holds one; no HTTP).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _load() -> float:
    return float(open("/proc/loadavg").read().split()[0])


def _pct(xs: list[float]) -> list[float]:
    xs = sorted(xs)
    return [round(statistics.median(xs), 3), round(xs[int(round(0.95 * (len(xs) - 1)))], 3)]


def serve(args) -> None:
    """In the checkout this process was started in (its cwd): a line N on stdin writes the next N main batches
    and answers their timings on stdout; end of input drops the database."""
    sys.path.insert(0, os.getcwd())
    from bench.tracker.scratch_site import drop_database, make_runs, recreate_database, setup_django

    database = f"bench_ingest_{args.slot}_{os.getppid()}"  # two runs of this script at once do not collide
    setup_django(recreate_database(database))
    from django.db import connection, connections, transaction
    from django.test.utils import CaptureQueriesContext

    from bench.tracker.metrics import batches
    from runs.tracking.reported_points import points_check, points_report
    from runs.tracking.services import metrics_record

    _, _, training = make_runs(1 + args.other_runs, workdir=Path(tempfile.mkdtemp(prefix="bench-ingest-")))
    main, others = training[0].pk, [t.pk for t in training[1:]]
    n = args.points

    def write(training_run_id, steps, values):  # as bench/tracker/metrics.py's ours() writes
        points = [{"split": "train", "key": "loss", "step": int(s), "epoch": float(s) / n * 3, "value": float(v)}
                  for s, v in zip(steps, values)]
        if not args.api:
            metrics_record(training_run_id=training_run_id, points=points)
            return
        with transaction.atomic():
            counts = points_report(training_run_id=training_run_id, points=points_check(points))
        assert counts.accepted == len(points), counts

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    mains = batches(n, args.batch, seed=0)
    other_batches = [batches(args.other_points, args.batch, seed=i + 1) for i in range(len(others))]
    turn = 0
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        wall, cpu, queries = [], [], []
        for _ in range(int(line)):
            batch = next(mains, None)
            if batch is None:
                break
            steps, values = batch
            with CaptureQueriesContext(connection) as ctx:
                if profiler:
                    profiler.enable()
                t0, c0 = time.perf_counter(), time.process_time()
                write(main, steps, values)
                wall.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
                if profiler:
                    profiler.disable()
            queries.append(len(ctx.captured_queries))
            for _ in range(2):  # two other batches per main batch, as metrics.py's ingest()
                if not other_batches:
                    break
                k = turn % len(other_batches)
                turn += 1
                try:
                    s, v = next(other_batches[k])
                    write(others[k], s, v)
                except StopIteration:
                    other_batches.pop(k)
                    others = others[:k] + others[k + 1:]
        print(json.dumps({"wall_ms": wall, "cpu_ms": cpu, "queries": queries}), flush=True)
    if profiler:
        import pstats

        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    connections.close_all()
    drop_database(database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", default=[])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--segment", type=int, default=10, help="main batches per turn")
    parser.add_argument("--other-runs", type=int, default=50)
    parser.add_argument("--other-points", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--api", action="store_true", help="write as the API stores a client's report")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--slot", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    workers = []
    for slot, checkout in enumerate(args.checkout):
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", "--slot", str(slot),
                   "--points", str(args.points), "--other-runs", str(args.other_runs),
                   "--other-points", str(args.other_points), "--batch", str(args.batch),
                   *(["--profile"] if args.profile else []), *(["--api"] if args.api else [])]
        workers.append(subprocess.Popen(command, cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=sys.stderr if args.profile else subprocess.DEVNULL, text=True))
    for worker in workers:
        while "ready" not in json.loads(worker.stdout.readline() or '{"ready": "lost"}'):
            pass
    timings = [{"wall_ms": [], "cpu_ms": [], "queries": []} for _ in workers]
    loads, turns = [], -(-args.points // args.batch // args.segment)
    for turn in range(turns):
        loads.append(_load())
        for i in (range(len(workers)) if turn % 2 == 0 else reversed(range(len(workers)))):
            workers[i].stdin.write(f"{args.segment}\n")
            workers[i].stdin.flush()
            for name, values in json.loads(workers[i].stdout.readline()).items():
                timings[i][name] += values
    for worker in workers:
        worker.stdin.close()
        worker.wait(timeout=600)
    out = {"path": "api" if args.api else "workers", "points": args.points, "batch": args.batch,
           "segment": args.segment, "turns": turns,
           "load_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}, "checkouts": {}}
    for checkout, t in zip(args.checkout, timings):
        out["checkouts"][checkout] = {
            "points_per_s": round(args.batch * len(t["wall_ms"]) / (sum(t["wall_ms"]) / 1000)),
            "batch_wall_ms": _pct(t["wall_ms"]), "batch_cpu_ms": _pct(t["cpu_ms"]),
            "batch_cpu_ms_mean": round(statistics.mean(t["cpu_ms"]), 3),
            "queries_per_batch_mean": round(statistics.mean(t["queries"]), 2)}
    first = out["checkouts"][args.checkout[0]]
    for row in out["checkouts"].values():
        row["vs_first"] = round(row["points_per_s"] / first["points_per_s"], 3)
        row["cpu_vs_first"] = round(row["batch_cpu_ms_mean"] / first["batch_cpu_ms_mean"], 3)
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
