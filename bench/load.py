"""Benchmark (not a test): the dashboard under concurrent signed-in clients while a run trains.

    .venv/bin/python bench/load.py --clients 50 --seconds 30 --json

What each side does:
- Database: creates the PostgreSQL database `bench_load` (dropped at the end), migrates it, adds a
  user and --runs runs (services.run_launch). All but one are finished: stage rows and attempts
  succeeded with 2 kB logs, a 100-step curve and two checkpoints (the workers' metrics_record and
  checkpoints_register), an approval.
- The training run: --trainer worker (default) starts a real Celery worker (redis db 5) that
  prepares, extracts and trains the demo target (300 chats, built once into data/bench-load-assets)
  on the CPU with one torch thread, for up to 1,000 epochs; measuring starts once its training has
  written curves, and the run is cancelled at the end. --trainer writer has no worker: the run's
  train stage is RUNNING and a thread appends metric points through the workers' own write path
  (`runs.tracking.services.metrics_record`, `stage_progress`) as the train stage does: a batch every
  2 s, 12 curves per step, --steps-per-second steps, on top of --history-steps steps already there
  (a longer curve and more writes than this CPU's real training makes).
- Web: gunicorn (eagle3web.wsgi, static files by WhiteNoise, as docker-compose.yml runs it) on
  127.0.0.1 with --gunicorn-workers sync workers (default 2 x cores + 1, gunicorn's advice), each
  keeping its database connection for --conn-max-age seconds (compose's default, 60).
- Clients: --clients threads, each logged in through the login form (own session cookie), then
  looping for --seconds like a person opening a run: runs list, the training run's page, its curve
  from the start (what the page loads) and its curve since the last point seen (what the page polls).
  No think time: each client sends its next request as soon as the last one answered.
Prints latency percentiles over every request, per endpoint too; `errors` counts anything but a 200.
Cleans up gunicorn, the worker, the database and its temp directory, also on Ctrl-C.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PASSWORD = "bench-load-password-1"
CURVES_PER_STEP = 12  # loss, loss_k, full_acc_k, cond_acc_k for 3 ttt steps, lr, tokens_per_s
FLUSH_SECONDS = 2.0  # workers.stages.train.loop.METRICS_FLUSH_SECONDS


def parse_args() -> argparse.Namespace:
    cores = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--runs", type=int, default=50, help="runs in the database, the training one included")
    p.add_argument("--trainer", choices=("worker", "writer"), default="worker")
    p.add_argument("--steps-per-second", type=float, default=10, help="writer: training steps per second")
    p.add_argument("--history-steps", type=int, default=500, help="writer: steps trained before measuring")
    p.add_argument("--gunicorn-workers", type=int, default=2 * cores + 1)
    p.add_argument("--conn-max-age", type=int, default=60,
                   help="DATABASE_CONN_MAX_AGE for gunicorn (docker-compose.yml's default; 0: a connection per request)")
    p.add_argument("--port", type=int, default=8781)
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_load")
    p.add_argument("--broker-url", default="redis://127.0.0.1:6379/5")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


# --- database -------------------------------------------------------------------------------------

def _admin(url: str, sql: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(sql.format(name=name))


def drop_database(url: str) -> None:
    from django.db import connections

    connections.close_all()
    _admin(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# --- rows -----------------------------------------------------------------------------------------

def _points(steps: range, epoch_steps: int) -> list[dict]:
    keys = ["loss", "loss_0", "loss_1", "loss_2", "full_acc_0", "full_acc_1", "full_acc_2",
            "cond_acc_0", "cond_acc_1", "cond_acc_2", "lr", "tokens_per_s"]
    return [{"step": s, "epoch": s / epoch_steps, "split": "train", "key": k, "value": 1.0 / (1 + s) + i}
            for s in steps for i, k in enumerate(keys)]


def _finish(run, *, statuses: dict[str, str], log: str) -> None:
    """Stage rows and attempts as a worker leaves them (plain ORM: the gates a worker passes, such as
    a verified extraction before training, are not what this benchmark measures)."""
    from django.utils import timezone

    from runs.models import StageAttempt
    from runs.pipeline.stages import STAGES

    now = timezone.now()
    for stage in STAGES:
        status = statuses.get(stage.name, "succeeded")
        if status == "queued":
            continue
        finished = None if status == "running" else now
        stage.model.objects.filter(run=run).update(status=status, started_at=now, finished_at=finished,
                                                   log_tail=log, worker="bench@host", progress_done=100,
                                                   progress_total=100)
        record_id = stage.model.objects.values_list("pk", flat=True).get(run=run)
        StageAttempt.objects.create(run=run, stage=stage.name, record_id=record_id, number=1, worker="bench@host",
                                    started_at=now, finished_at=finished, outcome=status, log_tail=log)


def seed(*, runs: int, target_dir: Path, chats: Path) -> tuple[object, object]:
    """The user and `runs` runs, all but the last finished; returns (user, the last one, still queued)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from runs.pipeline import services, stage_services
    from runs.review import reviews
    from runs.tracking import services as metric_services
    from runs.pipeline.run_config import RunConfig

    user = get_user_model().objects.create_user("bench", password=PASSWORD, is_superuser=True)
    user.groups.add(Group.objects.get_or_create(name="launcher")[0])
    log = "\n".join(f"step {i}: loss 1.{i:04d}, {i * 37} tokens/s" for i in range(60))  # a 2 kB log tail
    launched = [services.run_launch(user=user, target_path=target_dir, dataset_path=chats, name=f"bench run {i}",
                                    config=RunConfig(epochs=1000), enqueue=False) for i in range(runs)]
    for run in launched[:-1]:
        _finish(run, statuses={}, log=log)
        training_id = run.training_run.pk
        metric_services.metrics_record(training_run_id=training_id, points=_points(range(1, 101), 50))
        stage_services.checkpoints_register(training_run_id=training_id, checkpoints=[
            {"epoch": e, "path": f"{run.output_dir}/checkpoints/{e}", "train_loss": 1.0, "val_loss": 1.1,
             "is_best": e == 1, "val_metrics": {"full_acc_0": 0.5, "cond_acc_0": 0.5}} for e in range(2)])
        reviews.review_add(user=user, subject=run, decision="approve", text="curves look right")
    return user, launched[-1]


class Writer(threading.Thread):
    """What a training worker writes while it trains: a batch of metric points every 2 s and its progress."""

    def __init__(self, *, run, steps_per_second: float, history_steps: int):
        super().__init__(daemon=True)
        from runs.pipeline import stage_services
        from runs.tracking import services as metric_services
        from runs.models import TrainingRun

        _finish(run, statuses={"train": "running", "evaluate": "queued"}, log="")
        self.services, self.rate, self.step = stage_services, steps_per_second, history_steps
        self.record_id, self.total = run.training_run.pk, history_steps * 20
        self.started_at = TrainingRun.objects.get(pk=self.record_id).started_at
        metric_services.metrics_record(training_run_id=self.record_id, points=_points(range(1, history_steps + 1), 250))
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from runs.tracking.services import metrics_record

        try:
            while not self.stop.wait(FLUSH_SECONDS):
                steps = range(self.step + 1, self.step + 1 + round(self.rate * FLUSH_SECONDS))
                metrics_record(training_run_id=self.record_id, points=_points(steps, 250))
                self.step = steps[-1]
                self.services.stage_progress(stage_name="train", record_id=self.record_id, done=self.step,
                                             total=self.total, log_tail=f"step {self.step}", started_at=self.started_at)
        finally:
            connection.close()


# --- processes ------------------------------------------------------------------------------------

def start(cmd: list[str], *, env: dict, log: Path) -> subprocess.Popen:
    # Its own process group, so that stopping it stops its children (gunicorn's and celery's workers).
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


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
             ("curve_full", lambda: f"/api/runs/{run_id}/metrics/?points=2000"),
             ("curve_poll", lambda: f"/api/runs/{run_id}/metrics/?start={since}")]
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


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)

    def at(q: float) -> float | None:  # nearest rank: the smallest value with q of all at or below it
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1) if ordered else None

    return {"p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99)}


def summarize(samples: list, seconds: float) -> dict:
    out = {**percentiles([ms for _, ms, _, _ in samples]), "requests": len(samples),
           "errors": sum(1 for s in samples if not s[2]), "requests_per_s": round(len(samples) / seconds, 1),
           "endpoints": {}}
    for name in dict.fromkeys(s[0] for s in samples):
        mine = [s for s in samples if s[0] == name]
        out["endpoints"][name] = {**percentiles([s[1] for s in mine]), "requests": len(mine),
                                  "errors": sum(1 for s in mine if not s[2]),
                                  "mean_bytes": round(sum(s[3] for s in mine) / len(mine))}
    return out


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
           "TOKENIZERS_PARALLELISM": "false", "DJANGO_LOG_LEVEL": "WARNING"}
    env.pop("DJANGO_DEBUG", None)  # local mode: plain HTTP on 127.0.0.1, DEBUG off
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        _admin(args.database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # left by a killed run
        _admin(args.database_url, 'CREATE DATABASE "{name}"')
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
            from runs.pipeline.queue import pipeline_enqueue

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
        gunicorn = start([sys.executable, "-m", "gunicorn", "eagle3web.wsgi", "--bind", f"127.0.0.1:{args.port}",
                          "--workers", str(args.gunicorn_workers), "--no-control-socket"],
                         env=env, log=tmp / "gunicorn.log")
        cleanup.callback(stop, gunicorn)
        wait_for_http(args.port, gunicorn, tmp / "gunicorn.log")
        sessions: list[dict] = []
        for first in range(0, args.clients, args.gunicorn_workers):  # a login hashes a password for 0.5 s: a few at once
            run_all([lambda: sessions.append(login(args.port, "bench"))] * min(args.gunicorn_workers, args.clients - first))
        if len(sessions) != args.clients:
            raise SystemExit(f"only {len(sessions)} of {args.clients} clients logged in")
        points_before = count_points()
        samples: list = []
        load_before, began = os.getloadavg()[0], time.monotonic()
        run_all([lambda c=cookies: client(args.port, c, run.pk, began + args.seconds, samples) for cookies in sessions])
        elapsed = time.monotonic() - began
        result = {**summarize(samples, elapsed), "clients": args.clients, "seconds": round(elapsed, 1),
                  "gunicorn_workers": args.gunicorn_workers, "conn_max_age": args.conn_max_age, "runs": args.runs, "trainer": args.trainer,
                  "training_status": TrainingRun.objects.get(run=run).status,
                  "metric_points_written_while_measuring": count_points() - points_before,
                  "curve_points_at_end": count_points(), "database": "postgresql",
                  "cores": os.cpu_count(), "date": datetime.date.today().isoformat(),
                  # Other work on the machine shows here: the figures above are only this app's on a quiet one.
                  "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
