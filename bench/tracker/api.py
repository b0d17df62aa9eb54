"""Benchmark (not a test): curve points sent through the API by the client, against MLflow's REST log-batch.

    make mlflow    # once: MLflow's tracking server in its own environment, .venv-mlflow
    .venv/bin/python bench/tracker/api.py --json

What each side does:
- eagle3web: creates the PostgreSQL database `bench_api` (dropped at the end), migrates it, adds a launcher
  and an API token (runs.api.tokens), and serves the app with gunicorn on 127.0.0.1 as docker-compose.yml
  runs it (sync workers, DEBUG off), as bench/load/load.py does. eagle3web_client.Client creates an external
  run and sends the points with runs.log_metrics, one batch at a time (POST /api/v1/runs/<id>/metrics/).
- MLflow: `mlflow server` from .venv-mlflow with its backend store in a PostgreSQL database of its own on
  the same server as ours (bench_api_mlflow), as many workers as gunicorn has; one experiment, one run; the same points
  in the same batches, each a POST /api/2.0/mlflow/runs/log-batch (at most 1,000 metrics a call, MLflow's limit, hence
  --batch-size at most 1,000 for both), through an httpx.Client kept open as the client keeps its own.
Both from this one process, one after the other, one request at a time. The points are what a speculators
training reports: --keys curves per step (loss, loss_k, full_acc_k, cond_acc_k, lr, tokens_per_s), steps in
order. Afterwards each side's stored count is checked (every point once). Prints points/s for each, the
latency of a batch (p50, p95) for each, their ratio, and the load average before and after: the figures
are of this machine as loaded at the time, so say so with them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.load.processes import database_admin, start, stop  # noqa: E402 - as bench/load/load.py

MLFLOW_VENV = REPO / ".venv-mlflow"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=int, default=120_000)
    p.add_argument("--keys", type=int, default=12, help="curves per step (a speculators step with 3 TTT steps: 12)")
    p.add_argument("--batch-size", type=int, default=1000, help="points per request, both sides (MLflow: at most 1,000)")
    p.add_argument("--gunicorn-workers", type=int, default=3, help="gunicorn's sync workers, and MLflow's workers")
    p.add_argument("--port", type=int, default=8782)
    p.add_argument("--mlflow-port", type=int, default=8783)
    p.add_argument("--no-mlflow", action="store_true", help="measure eagle3web alone")
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_api")
    p.add_argument("--broker-url", default="redis://127.0.0.1:6379/6")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not 1 <= args.batch_size <= 1000:
        p.error("--batch-size must be from 1 to 1,000 (MLflow's log-batch takes at most 1,000 metrics)")
    return args


def key_names(count: int) -> list[str]:
    names = ["loss"]
    k = 0
    while len(names) < count - 2:
        names += [f"loss_{k}", f"full_acc_{k}", f"cond_acc_{k}"]
        k += 1
    return (names[:max(count - 2, 1)] + ["lr", "tokens_per_s"])[:count]


def make_points(total: int, keys: list[str]) -> list[dict]:
    """A falling, noisy curve per key, step by step as a trainer logs them."""
    points = []
    step = 0
    while len(points) < total:
        step += 1
        for i, key in enumerate(keys):
            if len(points) == total:
                break
            value = 3.0 * math.exp(-step / 4000) + 0.01 * math.sin(step * (i + 1)) + i * 1e-3
            points.append({"key": key, "split": "train", "step": step, "value": value, "epoch": step / 5000})
    return points


# --- processes ------------------------------------------------------------------------------------

def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=2)
            return
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)  # nearest rank
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def timed_batches(send, points: list[dict], batch_size: int) -> tuple[float, list[float]]:
    latencies = []
    started = time.perf_counter()
    for first in range(0, len(points), batch_size):
        t = time.perf_counter()
        send(points[first:first + batch_size])
        latencies.append(time.perf_counter() - t)
    return time.perf_counter() - started, latencies


# --- the two sides --------------------------------------------------------------------------------

def eagle3web_side(args, points: list[dict], tmp: Path, cleanup: contextlib.ExitStack) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "eagle3web.settings", "DATABASE_URL": args.database_url,
           "DATABASE_CONN_MAX_AGE": "60", "CELERY_BROKER_URL": args.broker_url, "EAGLE3WEB_DATA_DIR": str(tmp),
           "EAGLE3WEB_DATA_ROOTS": str(tmp), "EAGLE3WEB_RUNS_DIR": str(tmp / "runs"), "OMP_NUM_THREADS": "1",
           "DJANGO_LOG_LEVEL": "WARNING", "DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
           "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "DJANGO_SECURE_SSL_REDIRECT": "0",
           "DJANGO_SESSION_COOKIE_SECURE": "0", "DJANGO_CSRF_COOKIE_SECURE": "0", "DJANGO_SECURE_HSTS_SECONDS": "0"}
    database_admin(args.database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # left by a killed run
    database_admin(args.database_url, 'CREATE DATABASE "{name}"')

    def drop() -> None:
        from django.db import connections

        connections.close_all()
        database_admin(args.database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    cleanup.callback(drop)
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from runs.api import tokens
    from runs.models import MetricSeries

    call_command("migrate", verbosity=0, interactive=False)
    user = User.objects.create_user("bench-api")
    user.groups.add(Group.objects.get_or_create(name="launcher")[0])
    secret = tokens.token_create(user=user, name="bench")[1]

    log = tmp / "gunicorn.log"
    gunicorn = start([sys.executable, "-m", "gunicorn", "eagle3web.wsgi", "--bind", f"127.0.0.1:{args.port}",
                      "--workers", str(args.gunicorn_workers), "--no-control-socket"], env=env, log=log)
    cleanup.callback(stop, gunicorn)
    url = f"http://127.0.0.1:{args.port}"
    wait_for(f"{url}/api/v1/me/", gunicorn, log)

    from eagle3web_client import Client

    counts = {"accepted": 0, "unchanged": 0, "replaced": 0}
    with Client(url, secret, timeout=120) as client:
        run = client.runs.create_external(name="bench api", config={"trainer": "bench"})
        client.runs.log_metrics(run["id"], [{"key": "warmup", "split": "val", "step": 0, "value": 0.0}])

        def send(batch: list[dict]) -> None:
            for key, value in client.runs.log_metrics(run["id"], batch).items():
                counts[key] += value

        seconds, latencies = timed_batches(send, points, args.batch_size)
        retried = client.retried
    stored = sum(MetricSeries.objects.filter(training_run__run_id=run["id"], split="train")
                 .values_list("num_points", flat=True))
    if counts["accepted"] != len(points) or stored != len(points):
        raise SystemExit(f"eagle3web stored {stored} of {len(points)} points (answers: {counts})")
    return {"seconds": seconds, "latencies": latencies, "retried": retried}


def mlflow_side(args, points: list[dict], tmp: Path, cleanup: contextlib.ExitStack) -> dict:
    mlflow = MLFLOW_VENV / "bin" / "mlflow"
    if not mlflow.exists():
        raise SystemExit(f"{mlflow} is missing: run `make mlflow` first, or pass --no-mlflow")
    version = subprocess.run([str(mlflow), "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    log = tmp / "mlflow.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_HOME": str(tmp)}
    # Its store on the same PostgreSQL server as ours, a database of its own: the baseline writes where we do.
    store = args.database_url.rsplit("/", 1)[0] + "/bench_api_mlflow"
    database_admin(store, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    database_admin(store, 'CREATE DATABASE "{name}"')
    cleanup.callback(database_admin, store, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    server = start([str(mlflow), "server", "--backend-store-uri", "postgresql+psycopg2://" + store.split("://", 1)[1],
                    "--default-artifact-root", str(tmp / "mlartifacts"), "--host", "127.0.0.1",
                    "--port", str(args.mlflow_port), "--workers", str(args.gunicorn_workers)], env=env, log=log)
    cleanup.callback(stop, server)
    base = f"http://127.0.0.1:{args.mlflow_port}/api/2.0/mlflow"
    wait_for(f"http://127.0.0.1:{args.mlflow_port}/health", server, log, timeout=180)
    with httpx.Client(base_url=base, timeout=120) as http:
        def post(path: str, body: dict) -> dict:
            answer = http.post(path, json=body)
            if answer.status_code != 200:
                raise SystemExit(f"MLflow {path}: {answer.status_code} {answer.text[:500]}")
            return answer.json()

        experiment = post("/experiments/create", {"name": "bench-api"})["experiment_id"]
        run_id = post("/runs/create", {"experiment_id": experiment, "start_time": int(time.time() * 1000)})["run"]["info"]["run_id"]
        post("/runs/log-batch", {"run_id": run_id, "metrics": [{"key": "warmup", "value": 0.0, "timestamp": 0, "step": 0}]})

        def send(batch: list[dict]) -> None:
            now = int(time.time() * 1000)
            post("/runs/log-batch", {"run_id": run_id, "metrics": [
                {"key": p["key"], "value": p["value"], "timestamp": now, "step": p["step"]} for p in batch]})

        seconds, latencies = timed_batches(send, points, args.batch_size)
        stored = 0
        for key in dict.fromkeys(p["key"] for p in points):
            token = None
            while True:
                page = http.get("/metrics/get-history", params={"run_id": run_id, "metric_key": key,
                                                                 "max_results": 25000, **({"page_token": token} if token else {})}).json()
                stored += len(page.get("metrics", []))
                token = page.get("next_page_token")
                if not token:
                    break
    if stored != len(points):
        raise SystemExit(f"MLflow stored {stored} of {len(points)} points")
    return {"seconds": seconds, "latencies": latencies, "version": version}


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    points = make_points(args.points, key_names(args.keys))
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="eagle3web-bench-api-"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        ours = eagle3web_side(args, points, tmp, cleanup)
        theirs = None if args.no_mlflow else mlflow_side(args, points, tmp, cleanup)
    ms = lambda seconds: round(seconds * 1000, 1)  # noqa: E731
    result = {
        "api_ingest_points_per_s": round(len(points) / ours["seconds"]),
        "mlflow_ingest_points_per_s": round(len(points) / theirs["seconds"]) if theirs else None,
        "ratio": round(theirs["seconds"] / ours["seconds"], 2) if theirs else None,
        "batch_p95_ms": ms(percentile(ours["latencies"], 0.95)),
        "batch_p50_ms": ms(percentile(ours["latencies"], 0.50)),
        "mlflow_batch_p95_ms": ms(percentile(theirs["latencies"], 0.95)) if theirs else None,
        "mlflow_batch_p50_ms": ms(percentile(theirs["latencies"], 0.50)) if theirs else None,
        "points": len(points), "batch_size": args.batch_size, "batches": len(ours["latencies"]),
        "keys": args.keys, "workers": args.gunicorn_workers, "client_retries": ours["retried"],
        "mlflow_version": theirs["version"] if theirs else None, "mlflow_backend": "postgresql" if theirs else None,
        "cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
