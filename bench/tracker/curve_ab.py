"""A signed-in session's repeated curve read and status poll, two checkouts side by side (issue 40): not a test.

    .venv/bin/python bench/tracker/curve_ab.py --build 1000000 --database bench_curve_ab     # once
    .venv/bin/python bench/tracker/curve_ab.py --database bench_curve_ab --checkout ../eagle3web-before \\
        --checkout . --rounds 4 --json

--build makes the database: a run whose training holds one series (`loss`, split train) of that many points
written through the workers' write path (runs.tracking.services.metrics_record, batches of 10,000), and a
second run whose training is running (the status poll's). It is kept for the timed runs (drop it with
`dropdb`). The timed mode runs each checkout's code in a process of its own, alternately, `--rounds` times,
on that database as migrated by the newest checkout (run `migrate` with it first), with the environment
this script was given (EAGLE3WEB_CACHE_URL or CELERY_BROKER_URL: the caches and sessions the settings pick
from it). In each, through Django's test client in the process, signed in with a session (force_login):
- curve: `/api/v1/runs/<id>/metrics/?keys=loss&split=train&points=2000`, as bench/tracker/metrics.py's
  ours() asks it: the same request again and again, so that after the first it is answered from the cache;
- status_304: the running run's status poll as the run page makes it (`?since=<state_version>` with the
  ETag it holds), answered 304.
Each is requested twice untimed, then `--requests` times. Prints per checkout and request the median and
p95 of the wall time and of this process's CPU time, the queries of one request, and the 1-minute load.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the bench's own helpers: this checkout's, whichever checkout is timed

from bench.tracker.scratch_site import PG, alternately, median_p95  # noqa: E402


def build(points: int, database: str) -> dict:
    from bench.tracker.metrics import batches
    from bench.tracker.scratch_site import make_runs, recreate_database, setup_django

    setup_django(recreate_database(database))
    from django.db import connection
    from django.utils import timezone

    from runs.models import StageStatus, TrainingRun
    from runs.tracking.services import metrics_record

    t0 = time.perf_counter()
    _, runs, training = make_runs(2, workdir=Path(tempfile.mkdtemp(prefix="bench-curve-ab-")))
    for steps, values in batches(points, 10_000, seed=0):
        metrics_record(training_run_id=training[0].pk, points=[
            {"split": "train", "key": "loss", "step": int(s), "epoch": float(s) / points * 3, "value": float(v)}
            for s, v in zip(steps, values)])
    now = timezone.now()
    TrainingRun.objects.filter(pk=training[1].pk).update(status=StageStatus.RUNNING, started_at=now, worker="w",
                                                         lease_expires_at=now + timezone.timedelta(days=30))
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {"points": points, "curve_run": runs[0].pk, "running_run": runs[1].pk,
            "built_s": round(time.perf_counter() - t0, 1)}


def _timed_requests(client, requests: int, url: str, headers: dict, status: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        client.get(url, headers=headers)
    wall, cpu = [], []
    for _ in range(requests):
        t0, c0 = time.perf_counter(), time.process_time()
        response = client.get(url, headers=headers)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        assert response.status_code == status, (url, response.status_code, response.content[:200])
    with CaptureQueriesContext(connection) as queries:
        client.get(url, headers=headers)
    return {"wall_ms": median_p95(wall, 3), "cpu_ms": median_p95(cpu, 3), "queries": len(queries.captured_queries),
            "bytes": len(response.content)}


def timed(database: str, requests: int) -> dict:
    """In the checkout this process was started in (its cwd)."""
    sys.path.insert(0, os.getcwd())
    os.environ["DATABASE_URL"] = f"{PG}/{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from runs.models import PipelineRun, StageStatus

    curve_run = PipelineRun.objects.filter(training_run__metric_series__key="loss").get()
    running = PipelineRun.objects.get(training_run__status=StageStatus.RUNNING)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(pk=curve_run.owner_id))
    out = {"session_engine": settings.SESSION_ENGINE}
    out["curve"] = _timed_requests(client, requests, f"/api/v1/runs/{curve_run.pk}/metrics/?keys=loss&split=train"
                                   "&points=2000", {}, 200)
    status_url = f"/api/v1/runs/{running.pk}/status/"
    first = client.get(status_url)
    poll = f"{status_url}?since={first.json()['state_version']}"
    tag = client.get(poll)["ETag"]
    out["status_304"] = _timed_requests(client, requests, poll, {"If-None-Match": tag}, 304)
    out["load_1m"] = float(open("/proc/loadavg").read().split()[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", default="bench_curve_ab")
    parser.add_argument("--build", type=int, help="make the database with a curve of this many points, and stop")
    parser.add_argument("--checkout", action="append", default=[])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--in-checkout", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build(args.build, args.database)))
        return
    if args.in_checkout:
        print(json.dumps(timed(args.database, args.requests)))
        return
    results = alternately(__file__, args.checkout, args.rounds, ["--database", args.database, "--requests", str(args.requests)])
    print(json.dumps(results, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
