"""Benchmark (not a test): training curves at a million points, and the same series in MLflow; with
--scale-only, the runs list at 10,000 runs and a 50-run compare instead (bench/tracker/runs_scale.py).

    .venv/bin/python bench/tracker/metrics.py --points 1000000 --json     (or --scale-only --json)

Both sides get the same points: one series (`loss`, split train) of --points steps, a noisy
falling curve with a spike every 100,000 steps, written in batches of --batch points, interleaved
batch for batch with --other-runs other runs' series (--other-points each), so the main series'
rows are not contiguous in either store.

eagle3web: PostgreSQL database `bench_metrics` (created and dropped here), points written through
the workers' write path (`runs.tracking.services.metrics_record`), read through the curve endpoint
(`/api/v1/runs/<id>/metrics/`, Django's test client in this process, no HTTP socket): 2,000 points over
the whole series, and over a 10% window, each after WARM_UP untimed requests (on MLflow's side too). The
runs list is timed with --runs-list runs, with a saved view of one project applied (bench/tracker/runs_scale.py
runs_list_timed).

MLflow: `mlflow server` (installed for the benchmark only, in .venv-mlflow/ by `make mlflow`: mlflow 3.17.2
and psycopg2-binary) with a
PostgreSQL backend store (database `bench_mlflow`) on 127.0.0.1, the same points sent with
`runs/log-batch` (1,000 per request, MLflow's limit), read with `metrics/get-history` (every point,
paged) and `metrics/get-history-bulk-interval` (2,000 points over the whole series and the same
10% window) over HTTP. MLflow's side therefore includes an HTTP round trip per request; ours does
not, which docs/results.md states.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tracker.scratch_site import drop_database, free_port, make_runs, recreate_database, setup_django, stats  # noqa: E402




def curve(n: int, offset: int = 0, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    steps = np.arange(offset, offset + n, dtype=np.int64)
    values = 4.0 * np.exp(-steps / max(n, 1) * 3) + 0.5 + rng.normal(0, 0.05, n)
    values[steps % 100_000 == 50_000] += 25.0  # spikes a chart must not lose
    return steps, values


def batches(n: int, size: int, seed: int):
    steps, values = curve(n, seed=seed)
    for lo in range(0, n, size):
        yield steps[lo:lo + size], values[lo:lo + size]





# Curve reads untimed before the timed ones, on both sides: a serving process's first request loads what serving
# needs (ours took 846 ms, then 2 to 4 ms), which is not what a viewer waits for on a server that runs for weeks.
WARM_UP = 2


def ingest(*, main_id: int, other_ids: list[int], n: int, other_n: int, batch: int, write) -> dict:
    """Write the main series and the others, batch for batch; time the main series' writes only."""
    others = [batches(other_n, batch, seed=i + 1) for i in range(len(other_ids))]
    main_seconds, turn = 0.0, 0
    for steps, values in batches(n, batch, seed=0):
        t0 = time.perf_counter()
        write(main_id, steps, values)
        main_seconds += time.perf_counter() - t0
        for _ in range(2):  # two other batches per main batch: the others end first
            if not others:
                break
            k = turn % len(others)
            turn += 1
            try:
                s, v = next(others[k])
                write(other_ids[k], s, v)
            except StopIteration:
                others.pop(k)
                other_ids = other_ids[:k] + other_ids[k + 1:]
    return {"seconds": main_seconds, "points_per_s": n / main_seconds}


def ours(args) -> dict:
    setup_django(recreate_database("bench_metrics"))
    from django.test import Client

    from runs.tracking.services import metrics_record

    workdir = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    user, runs, training = make_runs(1 + args.other_runs, workdir=workdir)
    main, others = training[0], [t.pk for t in training[1:]]

    def write(training_run_id, steps, values):
        metrics_record(training_run_id=training_run_id, points=[
            {"split": "train", "key": "loss", "step": int(s), "epoch": float(s) / args.points * 3, "value": float(v)}
            for s, v in zip(steps, values)])

    result = {"ingest": ingest(main_id=main.pk, other_ids=others, n=args.points, other_n=args.other_points,
                               batch=args.batch, write=write)}
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    url = f"/api/v1/runs/{runs[0].pk}/metrics/"
    lo, hi = int(args.points * 0.45), int(args.points * 0.55)
    for name, params in (("curve", {"keys": "loss", "split": "train", "points": 2000}),
                         ("window_curve", {"keys": "loss", "split": "train", "points": 2000, "start": lo, "end": hi})):
        times, body = [], None
        for _ in range(WARM_UP):
            client.get(url, params)
        for _ in range(args.requests):
            t0 = time.perf_counter()
            response = client.get(url, params)
            times.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, response.content[:300]
            body = response.json()
        series = body["series"][0]
        spikes = [s for s, v in zip(series["steps"], series["values"]) if v > 20]
        result[name] = {"median_ms": stats(times)[0], "p95_ms": stats(times)[1], "points": len(series["steps"]),
                        "points_in_window": series["points_in_window"], "spikes_shown": len(spikes),
                        "bytes": len(response.content)}
    from bench.tracker.runs_scale import runs_list_timed

    result["runs_list"] = runs_list_timed(runs=runs, user=user, count=args.runs_list, requests=args.requests,
                                          workdir=workdir)
    from django.db import connections
    connections.close_all()
    drop_database("bench_metrics")
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def browser(args) -> dict:
    """A run with --browser-series series of --browser-points points each (2M in all by default):
    the run page in headless Chromium, from navigation to every chart drawn (curves.js marks it)."""
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    url = recreate_database("bench_metrics_browser")
    setup_django(url)
    from django.db import connections

    from runs.tracking.services import metrics_record

    workdir = Path(tempfile.mkdtemp(prefix="bench-browser-"))
    user, runs, training = make_runs(1, workdir=workdir)
    user.set_password("bench-password-1")
    user.save()
    keys = [f"{name}_{k}" for name in ("loss", "full_acc", "cond_acc") for k in range(3)] + ["lr"]
    keys = keys[:args.browser_series]
    for key in keys:
        for steps, values in batches(args.browser_points, 10_000, seed=len(key)):
            metrics_record(training_run_id=training[0].pk, points=[
                {"split": "train", "key": key, "step": int(s), "epoch": float(s) / args.browser_points, "value": float(v)}
                for s, v in zip(steps, values)])
    connections.close_all()
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "EAGLE3WEB_DATA_ROOTS": str(workdir)}
    try:
        from playwright.sync_api import sync_playwright

        from bench.tracker.web_server import runserver

        with runserver(port=port, env=env) as base, sync_playwright() as p:
            chrome = p.chromium.launch(executable_path="/usr/bin/chromium",
                                       args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = chrome.new_page(viewport={"width": 1400, "height": 2000})
            page.goto(base + "/login/")
            page.fill("#id_username", user.username)
            page.fill("#id_password", "bench-password-1")
            page.click("button[type=submit]")
            drawn = []
            for _ in range(args.browser_loads):
                page.goto(f"{base}/runs/{runs[0].pk}/")
                page.wait_for_selector("#curves[data-drawn-at]", timeout=60_000)
                drawn.append(float(page.get_attribute("#curves", "data-drawn-at")))
                charts = page.evaluate("document.querySelectorAll('#curve-plots .js-plotly-plot').length")
            chrome.close()
        return {"series": len(keys), "points": len(keys) * args.browser_points, "charts": charts,
                "drawn_ms_median": statistics.median(drawn), "drawn_ms": drawn}
    finally:
        from django.db import connections as conns

        conns.close_all()
        drop_database("bench_metrics_browser")
        shutil.rmtree(workdir, ignore_errors=True)



def http(method: str, url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read() or b"{}")


def mlflow(args) -> dict:
    exe = Path(args.mlflow)
    if not exe.exists():
        return {"skipped": f"{exe} not found: run `make mlflow` (mlflow 3.17.2 in .venv-mlflow)"}
    store = recreate_database("bench_mlflow").replace("postgres://", "postgresql+psycopg2://")
    port, workdir = free_port(), Path(tempfile.mkdtemp(prefix="bench-mlflow-"))
    server = subprocess.Popen([str(exe), "server", "--backend-store-uri", store, "--default-artifact-root",
                               str(workdir / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=open(workdir / "server.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if server.poll() is not None:
                break
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("mlflow server did not answer: " + (workdir / "server.log").read_text()[-2000:])
        experiment = http("POST", base + "/api/2.0/mlflow/experiments/create", {"name": "bench"})["experiment_id"]
        run_ids = [http("POST", base + "/api/2.0/mlflow/runs/create", {"experiment_id": experiment})["run"]["info"]["run_id"]
                   for _ in range(1 + args.other_runs)]
        now = int(time.time() * 1000)

        def write(run_id, steps, values):
            http("POST", base + "/api/2.0/mlflow/runs/log-batch", {"run_id": run_id, "metrics": [
                {"key": "loss", "value": float(v), "timestamp": now, "step": int(s)} for s, v in zip(steps, values)]})

        result = {"ingest": ingest(main_id=run_ids[0], other_ids=run_ids[1:], n=args.points,
                                   other_n=args.other_points, batch=args.batch, write=write)}
        t0, token, points = time.perf_counter(), None, 0
        while True:
            query = {"run_id": run_ids[0], "metric_key": "loss", "max_results": 25000, **({"page_token": token} if token else {})}
            page = http("GET", base + "/api/2.0/mlflow/metrics/get-history?" + urllib.parse.urlencode(query))
            points += len(page.get("metrics", []))
            token = page.get("next_page_token")
            if not token:
                break
        result["history"] = {"ms": (time.perf_counter() - t0) * 1000, "points": points}
        lo, hi = int(args.points * 0.45), int(args.points * 0.55)
        for name, extra in (("bulk_interval", {}), ("window_bulk_interval", {"start_step": lo, "end_step": hi})):
            times = []
            query = {"run_ids": run_ids[0], "metric_key": "loss", "max_results": 2000, **extra}
            for _ in range(WARM_UP):
                http("GET", base + "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?" + urllib.parse.urlencode(query))
            for _ in range(args.requests):
                t0 = time.perf_counter()
                body = http("GET", base + "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?" + urllib.parse.urlencode(query))
                times.append((time.perf_counter() - t0) * 1000)
            result[name] = {"median_ms": stats(times)[0], "p95_ms": stats(times)[1], "points": len(body.get("metrics", []))}
        return result
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
        drop_database("bench_mlflow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--other-runs", type=int, default=50)
    parser.add_argument("--other-points", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--runs-list", type=int, default=10_000)
    parser.add_argument("--mlflow", default=str(ROOT / ".venv-mlflow" / "bin" / "mlflow"))  # `make mlflow`
    parser.add_argument("--skip-mlflow", action="store_true")
    parser.add_argument("--browser", action="store_true", help="also time the run page in Chromium")
    parser.add_argument("--browser-series", type=int, default=10)
    parser.add_argument("--browser-points", type=int, default=200_000)
    parser.add_argument("--browser-loads", type=int, default=3)
    parser.add_argument("--browser-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scale-only", action="store_true", help="the runs list and compare at scale alone")
    parser.add_argument("--compare-runs", type=int, default=50)
    parser.add_argument("--scale-requests", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.scale_only:  # bench/tracker/runs_scale.py, a process of its own as --browser-only
        from bench.tracker.runs_scale import scale
        return print(json.dumps(scale(args), indent=None if args.json else 2))
    if args.browser_only:  # a process of its own: Django is set up once per process, on one database
        print(json.dumps(browser(args)))
        return

    mine = ours(args)
    theirs = {"skipped": "--skip-mlflow"} if args.skip_mlflow else mlflow(args)
    out = {
        "points": args.points, "other_runs": args.other_runs, "other_points": args.other_points, "batch": args.batch,
        "ingest_points_per_s": round(mine["ingest"]["points_per_s"]),
        "curve_ms_median": round(mine["curve"]["median_ms"], 1), "curve_ms_p95": round(mine["curve"]["p95_ms"], 1),
        "window_curve_ms_median": round(mine["window_curve"]["median_ms"], 1),
        "window_curve_ms_p95": round(mine["window_curve"]["p95_ms"], 1),
        "curve_points_returned": mine["curve"]["points"], "curve_spikes_shown": mine["curve"]["spikes_shown"],
        "curve_bytes": mine["curve"]["bytes"],
        # A saved view of one project (bench.tracker.runs_scale.runs_list_timed): the table built (cold), from the cache (warm).
        "runs_list_ms": mine["runs_list"]["cold"]["median_ms"], "runs_list_ms_p95": mine["runs_list"]["cold"]["p95_ms"],
        "runs_list_warm_ms": mine["runs_list"]["warm"]["median_ms"], "runs_list_runs": mine["runs_list"]["runs"],
        "runs_list_cpu_ms": mine["runs_list"]["cold"]["python_cpu_ms_median"],  # the web process's own (load-proof)
    }
    if "skipped" in theirs:
        out["mlflow"] = theirs
    else:
        out.update({
            "mlflow_ingest_points_per_s": round(theirs["ingest"]["points_per_s"]),
            "mlflow_history_ms": round(theirs["history"]["ms"], 1), "mlflow_history_points": theirs["history"]["points"],
            "mlflow_bulk_interval_ms": round(theirs["bulk_interval"]["median_ms"], 1),
            "mlflow_bulk_interval_points": theirs["bulk_interval"]["points"],
            "mlflow_window_bulk_interval_ms": round(theirs["window_bulk_interval"]["median_ms"], 1),
            "ingest_vs_mlflow": round(mine["ingest"]["points_per_s"] / theirs["ingest"]["points_per_s"], 2),
            "curve_vs_mlflow_bulk_interval": round(theirs["bulk_interval"]["median_ms"] / mine["curve"]["median_ms"], 2),
            "window_vs_mlflow_bulk_interval": round(
                theirs["window_bulk_interval"]["median_ms"] / mine["window_curve"]["median_ms"], 2),
        })
    if args.browser:
        done = subprocess.run([sys.executable, __file__, "--browser-only", "--browser-series", str(args.browser_series),
                               "--browser-points", str(args.browser_points), "--browser-loads", str(args.browser_loads)],
                              capture_output=True, text=True, check=True)
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        out.update({"browser_points_per_run": seen["points"], "browser_charts": seen["charts"],
                    "browser_all_charts_drawn_ms": round(seen["drawn_ms_median"]),
                    "browser_drawn_ms_each_load": seen["drawn_ms"]})
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
