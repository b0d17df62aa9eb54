"""Cold runs-list requests of two checkouts on one database, side by side (issue 40): not a test.

    .venv/bin/python bench/tracker/runs_list_ab.py --build 100000 --database bench_list_ab    # once: ~7 min
    .venv/bin/python bench/tracker/runs_list_ab.py --database bench_list_ab --checkout ../eagle3web-before --checkout . \\
        --url '/?q=spikes' --url '/?view=1' --rounds 2 --json

--build makes the database as bench/tracker/runs_scale.py's runs_list_timed does (metrics.make_runs, then five
projects, notes, τ, tags; the viewer `bench-viewer` a member of two projects) and saves the view of
runs_scale (project team 0, epochs=2, τ ≥ 2, sorted by τ); the database is kept for the timed runs (drop it
with `dropdb`). The timed mode runs each checkout's code in a process of its own, alternately, `--rounds`
times, on the database as migrated by the newest checkout (run `migrate` with it first): each URL requested
twice untimed, then `--requests` times with the shared cache emptied before each (the table built every
time), through Django's test client in the process. Prints per checkout and URL the median and p95 of the
request's wall time, of this process's CPU time (Python's part), of the SQL time Django measured, the slowest query's
median, and the 1-minute load.
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


def build(count: int, database: str) -> dict:
    from bench.tracker.scratch_site import make_runs, recreate_database, setup_django

    setup_django(recreate_database(database))
    from django.contrib.auth import get_user_model
    from django.db import connection

    from bench.tracker.runs_scale import _spread
    from runs.models import PipelineRun
    from runs.saved_views.services import saved_view_save

    t0 = time.perf_counter()
    user, _, _ = make_runs(count, workdir=Path(tempfile.mkdtemp(prefix="bench-list-ab-")))
    viewer = get_user_model().objects.create_user("bench-viewer", password="bench-password-1")
    _spread(list(PipelineRun.objects.only("pk").order_by("pk")), user, viewer)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    view = saved_view_save(user=viewer, name="team 0, 2 epochs, τ ≥ 2", params={
        "project": "team 0", "settings": "epochs=2", "tau_min": "2", "sort": "-tau",
        "columns": "name,status,tau,epochs,owner,created,tags"})
    return {"runs": count, "view": view.pk, "built_s": round(time.perf_counter() - t0, 1)}


def timed(database: str, urls: list[str], requests: int) -> dict:
    """In the checkout this process was started in (its cwd)."""
    sys.path.insert(0, os.getcwd())
    os.environ["DATABASE_URL"] = f"{PG}/{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(username="bench-viewer"))
    out = {}
    for url in urls:
        for _ in range(2):
            client.get(url)
        wall, cpu, sql, slowest = [], [], [], []
        for _ in range(requests):
            cache.clear()
            with CaptureQueriesContext(connection) as queries:
                t0, c0 = time.perf_counter(), time.process_time()
                response = client.get(url)
                wall.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)  # this process alone: the part load slows least
            times = [float(q["time"]) * 1000 for q in queries.captured_queries]
            sql.append(sum(times))
            slowest.append(max(times))
            assert response.status_code == 200, (url, response.status_code)
        out[url] = {"wall_ms": median_p95(wall), "python_cpu_ms": median_p95(cpu), "sql_ms": median_p95(sql), "slowest_query_ms_median": median_p95(slowest)[0],
                    "queries": len(queries.captured_queries), "rows": response.content.count(b'<tr data-run="'),
                    "load_1m": float(open("/proc/loadavg").read().split()[0])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default="bench_list_ab")
    parser.add_argument("--build", type=int, help="make the database with this many runs, and stop")
    parser.add_argument("--checkout", action="append", default=[])
    parser.add_argument("--url", action="append", default=[])
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-checkout", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build(args.build, args.database)))
        return
    if args.in_checkout:
        print(json.dumps(timed(args.database, args.url, args.requests)))
        return
    results = alternately(__file__, args.checkout, args.rounds, ["--database", args.database, "--requests", str(args.requests), *(x for url in args.url for x in ("--url", url))])
    print(json.dumps(results, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
