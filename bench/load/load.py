"""Benchmark (not a test): the dashboard under concurrent signed-in clients while a run trains.

    .venv/bin/python bench/load/load.py --clients 50 --seconds 30 --json
    .venv/bin/python bench/load/load.py --viewers 100 --seconds 60 --json

What each side does:
- Database: creates the PostgreSQL database `bench_load_<its pid>` (dropped at the end; a name of its own,
  as two runs at once would drop each other's), migrates it, adds a user per client or viewer, one more
  and --runs runs (services.run_launch). All but one are finished: stage rows and attempts succeeded with 2 kB logs, a
  100-step curve and two checkpoints (the workers' metrics_record and checkpoints_register), an approval.
- The training run: --trainer worker (default) starts a real Celery worker (redis db 5) that
  prepares, extracts and trains the demo target (300 chats, built once into data/bench-load-assets)
  on the CPU with one torch thread, for up to 1,000 epochs; measuring starts once its training has
  written curves, and the run is cancelled at the end. --trainer writer has no worker: the run's
  train stage is RUNNING and a thread appends metric points through the workers' own write path
  (`runs.tracking.services.metrics_record`, `stage_progress`) as the train stage does: a batch every
  2 s, 12 curves per step, --steps-per-second steps, on top of --history-steps steps already there
  (a longer curve and more writes than this CPU's real training makes).
- Web: gunicorn as docker-compose.yml runs it (eagle3web.wsgi, DJANGO_DEBUG=0 with a key of its own,
  collected static files served by WhiteNoise, an access log) on 127.0.0.1 with --gunicorn-workers
  sync workers (default WEB_CONCURRENCY, else 3: compose's default; --gunicorn-threads N > 1 runs
  gthread workers instead, which compose does not), each keeping its database connection for
  --conn-max-age seconds (compose's default, 60); the HTTPS settings are off, as .env.example says for
  plain HTTP.
- Clients: --clients threads, each signed in as a user of its own through the login form, then
  looping for --seconds like a person opening a run: runs list, the training run's page, its curve
  from the start (what the page loads) and its curve since the last point seen (what the page polls).
  No think time: each client sends its next request as soon as the last one answered.
- Viewers (--viewers N instead of the closed loop): N signed-in people each keeping the training run's
  page open, polling at the page's own intervals with If-None-Match as its scripts send it and
  reloading the page every minute (bench/load/viewers.py); --warmup seconds to open the pages, not counted.
Prints latency percentiles over every request, per endpoint too; `errors` counts anything but a 200
(or a 304 to a request that sent If-None-Match; viewers: `error_statuses` counts them by status and
`error_bodies` gives the start of one body of each), `not_modified` the 304s; `server_ms` the same
percentiles as gunicorn timed each request (its access log: without the wait for a free worker and
the client's share), `cpu_cores` the cores each side used while measuring (gunicorn, the trainer,
this benchmark's PostgreSQL backends and clients, each with what it started, the trainer's own session
included; "others" is everyone else's work on the machine,
roughly: a process that ended meanwhile takes its time with it), `load_average_1m` at start and end.
Cleans up gunicorn, the worker, the database and its temp directory, also on Ctrl-C.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.load import viewers  # noqa: E402 - bench/load/viewers.py: the run page as a browser keeps it open
from bench.load.load_report import cpu_use, server_times, summarize  # noqa: E402
from bench.load.load_rows import PASSWORD, Writer, people_add, seed  # noqa: E402 - request_costs reads them here too
from bench.load.processes import database_admin, start, stop  # noqa: E402
CURVES_PER_STEP = 12  # loss, loss_k, full_acc_k, cond_acc_k for 3 ttt steps, lr, tokens_per_s


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=50, help="closed loop: clients with no think time")
    p.add_argument("--viewers", type=int, default=0,
                   help="instead of the closed loop: viewers each keeping the training run's page open (bench/load/viewers.py)")
    p.add_argument("--warmup", type=float, default=10, help="viewers: seconds over which they open their pages, not counted")
    p.add_argument("--client-processes", type=int, default=4, help="viewers: client processes they are spread over")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--runs", type=int, default=50, help="runs in the database, the training one included")
    p.add_argument("--trainer", choices=("worker", "writer"), default="worker")
    p.add_argument("--steps-per-second", type=float, default=10, help="writer: training steps per second")
    p.add_argument("--history-steps", type=int, default=500, help="writer: steps trained before measuring")
    p.add_argument("--gunicorn-workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY") or 3),
                   help="gunicorn's sync workers: WEB_CONCURRENCY as docker-compose.yml reads it (default 3)")
    p.add_argument("--gunicorn-threads", type=int, default=1,
                   help="threads per gunicorn worker (1: sync workers, as docker-compose.yml runs them; more: gthread)")
    p.add_argument("--conn-max-age", type=int, default=60,
                   help="DATABASE_CONN_MAX_AGE for gunicorn (docker-compose.yml's default; 0: a connection per request)")
    p.add_argument("--port", type=int, default=8781)
    # A name of its own per run: a second benchmark at the same time drops and recreates its database.
    p.add_argument("--database-url", default=f"postgres://postgres@127.0.0.1:5432/bench_load_{os.getpid()}")
    p.add_argument("--broker-url", default="redis://127.0.0.1:6379/5")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


# --- database -------------------------------------------------------------------------------------


def drop_database(url: str) -> None:
    from django.db import connections

    connections.close_all()
    database_admin(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    from django.conf import settings

    call_command("migrate", verbosity=0, interactive=False)
    if settings.STATIC_ROOT:  # as compose's web command does before it starts gunicorn
        call_command("collectstatic", verbosity=0, interactive=False)


# --- processes ------------------------------------------------------------------------------------

def demo_assets(env: dict) -> tuple[Path, Path]:
    """A small demo target and its chats, built once into data/bench-load-assets and reused."""
    out = REPO / "data" / "bench-load-assets"
    code = ("import json, sys; from workers.stages.demo.assets import build_demo_assets; "
            "a = build_demo_assets(__import__('pathlib').Path(sys.argv[1]), num_conversations=300, train_steps=30); "
            "print(json.dumps([str(a.target_dir), str(a.chats_path)]))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, env=env, check=True,
                          capture_output=True, text=True)
    target, chats = json.loads(done.stdout.strip().splitlines()[-1])
    return Path(target), Path(chats)


def wait_for_training(run, *, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    from runs.models import MetricSeries, TrainingRun

    deadline = time.monotonic() + timeout
    while not MetricSeries.objects.filter(training_run__run=run).exists():
        status = TrainingRun.objects.get(run=run).status
        if proc.poll() is not None or status in ("failed", "cancelled") or time.monotonic() > deadline:
            raise SystemExit(f"training did not start (train stage {status}):\n{log.read_text()[-3000:]}")
        time.sleep(1)


def wait_for_http(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            if request(port, "GET", "/login/")[0] == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"gunicorn did not answer within {timeout} s")


# --- clients --------------------------------------------------------------------------------------

def request(port: int, method: str, path: str, *, cookies: dict | None = None, body: dict | None = None):
    """One request on a fresh connection (gunicorn's sync workers close each one); returns
    (status, body bytes, Set-Cookie values)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Host": "127.0.0.1", "Cookie": "; ".join(f"{k}={v}" for k, v in (cookies or {}).items())}
    data = None if body is None else urlencode(body)
    if body is not None:
        headers.update({"Content-Type": "application/x-www-form-urlencoded", "Referer": f"http://127.0.0.1:{port}/login/"})
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(), response.headers.get_all("Set-Cookie") or []
    finally:
        conn.close()


def _cookies(headers: list[str]) -> dict:
    return dict(h.split(";", 1)[0].split("=", 1) for h in headers)


def login(port: int, username: str) -> dict:
    status, page, set_cookie = request(port, "GET", "/login/")
    cookies = _cookies(set_cookie)
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
    status, _, set_cookie = request(port, "POST", "/login/", cookies=cookies,
                                    body={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token})
    cookies.update(_cookies(set_cookie))
    if status != 302 or "sessionid" not in cookies:
        raise SystemExit(f"login failed: {status}")
    return cookies


def client(port: int, cookies: dict, run_id: int, deadline: float, samples: list) -> None:
    since = 0  # as the run page polls: each time, only the steps after the last one it has
    pages = [("runs_list", lambda: "/"), ("run_page", lambda: f"/runs/{run_id}/"),
             ("curve_full", lambda: f"/api/v1/runs/{run_id}/metrics/?points=2000"),
             ("curve_poll", lambda: f"/api/v1/runs/{run_id}/metrics/?start={since}")]
    while time.monotonic() < deadline:
        for name, path in pages:
            started = time.perf_counter()
            try:
                status, body, _ = request(port, "GET", path(), cookies=cookies)
            except OSError as exc:
                status, body = f"{type(exc).__name__}", b""
            ms = (time.perf_counter() - started) * 1000
            samples.append((name, ms, status == 200, len(body)))
            if status == 200 and name.startswith("curve"):
                steps = [series["last_step"] for series in json.loads(body)["series"] if series["last_step"] is not None]
                since = min(steps) + 1 if steps else since
            if time.monotonic() >= deadline:
                return


def run_all(functions: list) -> None:
    threads = [threading.Thread(target=f, daemon=True) for f in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- main -----------------------------------------------------------------------------------------

def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = Path(tempfile.mkdtemp(prefix="eagle3web-bench-load-"))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "eagle3web.settings"),
           "DATABASE_URL": args.database_url, "DATABASE_CONN_MAX_AGE": str(args.conn_max_age),
           "CELERY_BROKER_URL": args.broker_url, "EAGLE3WEB_DATA_DIR": str(tmp),
           "EAGLE3WEB_DATA_ROOTS": f"{tmp}:{REPO / 'data'}", "EAGLE3WEB_RUNS_DIR": str(tmp / "runs"),
           # Two cores are shared by gunicorn, PostgreSQL, the clients and the trainer: one torch thread.
           "EAGLE3WEB_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "DJANGO_LOG_LEVEL": "WARNING",
           # Deployed, as docker-compose.yml runs the app (DEBUG off, a key of its own, collected static
           # files), with the HTTPS settings off as .env.example says for plain HTTP on 127.0.0.1.
           "DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
           "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "DJANGO_SECURE_SSL_REDIRECT": "0",
           "DJANGO_SESSION_COOKIE_SECURE": "0", "DJANGO_CSRF_COOKIE_SECURE": "0", "DJANGO_SECURE_HSTS_SECONDS": "0",
           "DJANGO_STATIC_ROOT": str(tmp / "staticfiles")}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        database_admin(args.database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # left by a killed run
        database_admin(args.database_url, 'CREATE DATABASE "{name}"')
        cleanup.callback(drop_database, args.database_url)
        django_setup(env)
        if args.trainer == "worker":
            target, chats = demo_assets(env)
        else:  # the writer needs no weights: a target's config.json and one chat
            (target := tmp / "target").mkdir()
            (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                            "num_hidden_layers": 8, "hidden_size": 128, "vocab_size": 2000}))
            (chats := tmp / "chats.jsonl").write_text(json.dumps({"messages": [
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
        user, run = seed(runs=args.runs, target_dir=target, chats=chats)
        from runs.models import MetricSeries, TrainingRun

        def count_points() -> int:
            return sum(MetricSeries.objects.filter(training_run__run=run).values_list("num_points", flat=True))

        if args.trainer == "worker":
            import redis

            from runs.pipeline import services
            from runs.pipeline.dispatch.queue import pipeline_enqueue

            cleanup.callback(lambda: redis.Redis.from_url(args.broker_url).flushdb())
            worker = start([sys.executable, "-m", "celery", "-A", "eagle3web", "worker", "-Q", "cpu,gpu",
                            "--concurrency", "1", "-n", "bench-load@%h", "--without-gossip", "--without-mingle",
                            "--loglevel", "INFO"], env=env, log=tmp / "worker.log")
            cleanup.callback(stop, worker)
            cleanup.callback(services.run_cancel, run=run, user=user)
            pipeline_enqueue(run_id=run.pk)
            wait_for_training(run, proc=worker, log=tmp / "worker.log", timeout=600)
        else:
            writer = Writer(run=run, steps_per_second=args.steps_per_second, history_steps=args.history_steps)
            writer.start()
            cleanup.callback(writer.join, 10)
            cleanup.callback(writer.stop.set)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", args.port), timeout=2):
            # Another server (someone else's benchmark) would answer our clients and hide our gunicorn's failure.
            raise SystemExit(f"port {args.port} is already in use: pass --port with a free one")
        access = tmp / "access.log"  # each request's path, status, milliseconds and bytes as gunicorn timed it, its query
        gunicorn = start([sys.executable, "-m", "gunicorn", "eagle3web.wsgi", "--bind", f"127.0.0.1:{args.port}",
                          "--workers", str(args.gunicorn_workers), "--threads", str(args.gunicorn_threads), "--no-control-socket", "--access-logfile",
                          str(access), "--access-logformat", "%(U)s %(s)s %(M)s %(B)s %(q)s"], env=env, log=tmp / "gunicorn.log")
        cleanup.callback(stop, gunicorn)
        wait_for_http(args.port, gunicorn, tmp / "gunicorn.log")
        sessions: list[dict] = []
        people = args.viewers or args.clients
        names = people_add(people)
        for first in range(0, people, args.gunicorn_workers):  # a login hashes a password for 0.5 s: a few at once
            run_all([lambda name=name: sessions.append(login(args.port, name)) for name in names[first:first + args.gunicorn_workers]])
        if len(sessions) != people:
            raise SystemExit(f"only {len(sessions)} of {people} clients logged in")
        points_before = count_points()
        samples: list = []
        groups = {"gunicorn": gunicorn.pid, "trainer": worker.pid if args.trainer == "worker" else -1,
                  "client": os.getpgid(0)}
        marks = {}  # the access log's size and the CPU used when measuring began and ended

        def mark(name: str) -> None:
            marks[name] = (access.stat().st_size, cpu_use(groups, database=args.database_url.rsplit("/", 1)[1]))

        load_before, began = os.getloadavg()[0], time.monotonic()
        if args.viewers:
            # Marked while the client processes run (a process that ended takes its CPU time with it).
            timers = [threading.Timer(1.0 + args.warmup, mark, args=("start",)),
                      threading.Timer(1.0 + args.warmup + args.seconds - 0.5, mark, args=("end",))]
            for timer in timers:
                timer.start()
            began = viewers.run_viewers(port=args.port, sessions=sessions, run_id=run.pk, warmup=args.warmup,
                                        seconds=args.seconds, samples=samples, processes=args.client_processes)
            # A viewer stops at its last request due before the deadline, so with few viewers they can all
            # be done before the "end" mark: wait for it rather than read a mark not yet taken.
            for timer in timers:
                timer.join()
        else:
            mark("start")
            run_all([lambda c=cookies: client(args.port, c, run.pk, began + args.seconds, samples) for cookies in sessions])
        elapsed = time.monotonic() - began
        if not args.viewers:
            mark("end")
        marked = args.seconds - 0.5 if args.viewers else elapsed
        cores = {name: round((marks["end"][1][name] - marks["start"][1][name]) / marked, 2) for name in marks["end"][1]}
        cores["others"] = round(cores["machine"] - sum(v for k, v in cores.items() if k != "machine"), 2)
        mode = ({"viewers": args.viewers, "warmup_seconds": args.warmup, "page_timings": viewers.page_timings(),
                 "client_processes": args.client_processes}
                if args.viewers else {"clients": args.clients})
        result = {**summarize(samples, elapsed), **mode, "seconds": round(elapsed, 1),
                  "gunicorn_workers": args.gunicorn_workers, "gunicorn_threads": args.gunicorn_threads, "conn_max_age": args.conn_max_age, "runs": args.runs, "trainer": args.trainer,
                  "training_status": TrainingRun.objects.get(run=run).status,
                  "metric_points_written_while_measuring": count_points() - points_before,
                  "curve_points_at_end": count_points(), "database": "postgresql",
                  "cores": os.cpu_count(), "date": datetime.date.today().isoformat(),
                  # Other work on the machine shows here: the figures above are only this app's on a quiet one.
                  "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                  # Cores busy while measuring, by whom: "others" is everyone else's work on the machine.
                  "cpu_cores": cores, "server_ms": server_times(access, marks["start"][0], marks["end"][0])}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
