"""Benchmark (not a test): what one request to each page of bench/load/load.py costs, alone, in-process.

    .venv/bin/python bench/load/request_costs.py --json

The same data as bench/load/load.py's `--trainer writer` run (50 runs, 49 finished with a curve, two
checkpoints and an approval; the last training, its curve 500 steps long with points appended every
2 s by the workers' own write path), in its own PostgreSQL database (`bench_request_costs`, dropped
at the end). One signed-in client (Django's test client, no HTTP, no server) asks for each page of
the load benchmark's loop --repeat times, one request at a time, after two warm-up requests; prints
per page the median and p90 ms and the SQL queries one request runs (`status_poll_live`: the status poll
with `?since=` the state of the summary it holds, as the run page polls it); the run's status and curve
polls also as the page sends them, with the ETag of an answer just before (304 unless a write came in
between). It says what a request costs
the server, which with no waiting bounds the throughput bench/load/load.py can reach on these cores.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.load import load  # noqa: E402 - bench/load/load.py: the same rows, built the same way


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_request_costs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eagle3web-bench-costs-"))
    env = {"DJANGO_SETTINGS_MODULE": "eagle3web.settings", "DATABASE_URL": args.database_url,
           "DATABASE_CONN_MAX_AGE": "60", "CELERY_BROKER_URL": "redis://127.0.0.1:6379/5",
           "EAGLE3WEB_DATA_DIR": str(tmp), "EAGLE3WEB_DATA_ROOTS": f"{tmp}:{load.REPO / 'data'}",
           "EAGLE3WEB_RUNS_DIR": str(tmp / "runs"), "EAGLE3WEB_TORCH_THREADS": "1"}
    os.environ.pop("DJANGO_DEBUG", None)
    with contextlib.ExitStack() as cleanup:
        load.database_admin(args.database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        load.database_admin(args.database_url, 'CREATE DATABASE "{name}"')
        cleanup.callback(load.drop_database, args.database_url)
        load.django_setup(env)
        target, chats = load.demo_assets({**os.environ, **env})
        user, run = load.seed(runs=args.runs, target_dir=target, chats=chats)
        writer = load.Writer(run=run, steps_per_second=10, history_steps=500)
        writer.start()
        cleanup.callback(writer.stop.set)

        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        client = Client(SERVER_NAME="127.0.0.1")
        client.force_login(user)
        pages = {"runs_list": "/", "run_page": f"/runs/{run.pk}/",
                 "curve_full": f"/api/v1/runs/{run.pk}/metrics/?points=2000",
                 "curve_poll": f"/api/v1/runs/{run.pk}/metrics/?start=490",
                 "status_poll": f"/api/v1/runs/{run.pk}/status/"}
        # The status poll as the run page sends it while it holds a summary: what moved since its state.
        state = client.get(pages["status_poll"]).json()["state_version"]
        pages["status_poll_live"] = f"{pages['status_poll']}?since={state}"
        # The polls again as the page sends them, with the ETag of an answer got just before (untimed):
        # 304 unless the writer moved the counter in between (`not_modified` says how many were).
        conditional = {"status_poll_304": pages["status_poll"], "curve_poll_304": pages["curve_poll"]}
        out = {}
        for name, path in {**pages, **conditional}.items():
            for _ in range(2):
                assert client.get(path).status_code == 200, path
            times, unchanged = [], 0

            def headers() -> dict:
                return {"HTTP_IF_NONE_MATCH": client.get(path)["ETag"]} if name in conditional else {}

            for _ in range(args.repeat):
                sent = headers()
                started = time.perf_counter()
                unchanged += client.get(path, **sent).status_code == 304
                times.append((time.perf_counter() - started) * 1000)
            sent = headers()
            with CaptureQueriesContext(connection) as queries:
                size = len(client.get(path, **sent).content)
            times.sort()
            out[name] = {"median_ms": round(statistics.median(times), 1),
                         "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
                         "queries": len(queries.captured_queries), "bytes": size,
                         **({"not_modified": unchanged} if name in conditional else {})}
        # The closed loop's four requests (bench/load/load.py --clients): what one of its rounds costs on average.
        mean = statistics.mean(out[name]["median_ms"] for name in ("runs_list", "run_page", "curve_full", "curve_poll"))
        result = {"pages": out, "mean_of_medians_ms": round(mean, 1), "repeat": args.repeat, "runs": args.runs,
                  "cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
                  "date": time.strftime("%Y-%m-%d")}
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
