"""What the benchmarks that build a site of their own share (bench/tracker/metrics.py, runs_scale.py,
generations_render.py, the *_ab.py side-by-side runs): a scratch PostgreSQL database made and dropped, Django set
up on it, runs made as the launch service leaves them, a free port, the median and p95 of timings, and checkouts
run alternately. Not a benchmark."""
from __future__ import annotations

import json
import os
import socket
import statistics
from pathlib import Path

PG = "postgres://postgres@127.0.0.1:5432"


def recreate_database(name: str) -> str:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG}/{name}"


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def stats(samples_ms: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def median_p95(samples_ms: list[float], digits: int = 1) -> list[float]:
    """stats() rounded, as the side-by-side benchmarks print it: [median, p95]."""
    return [round(value, digits) for value in stats(samples_ms)]


def alternately(script: str, checkouts: list[str], rounds: int, args: list[str],
                each: list[list[str]] | None = None) -> list[dict]:
    """`script --in-checkout ARGS` run in each checkout in turn, `rounds` times, each in a process of its own (its
    code imported from that checkout); the last line each prints, as JSON, with its round and checkout. `each`, one
    list per checkout, adds that checkout's own arguments (its database, say)."""
    import subprocess
    import sys

    results = []
    for round_ in range(rounds):
        for index, checkout in enumerate(checkouts):
            own = each[index] if each else []
            done = subprocess.run([sys.executable, str(Path(script).resolve()), "--in-checkout", *args, *own],
                                  cwd=checkout, capture_output=True, text=True, check=True)
            results.append({"round": round_ + 1, "checkout": checkout, **json.loads(done.stdout.strip().splitlines()[-1])})
    return results


def setup_django(database_url: str):
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def make_runs(count: int, *, workdir: Path):
    """`count` runs as the launch service leaves them: one launched for real, the rest copies of its
    rows made in bulk (launching 10,000 runs one by one would time the launch, not the list)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from runs.models import PipelineRun
    from runs.pipeline.lifecycle.stages import STAGES
    from runs.pipeline.launch.run_config import RunConfig
    from runs.pipeline.services import run_launch

    settings.EAGLE3WEB_DATA_ROOTS = [workdir]
    settings.EAGLE3WEB_RUNS_DIR = workdir / "runs"
    target = workdir / "target"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 32, "hidden_size": 4096,
                                                    "vocab_size": 128256}))
    chats = workdir / "chats.jsonl"
    chats.write_text(json.dumps({"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                                              {"from": "gpt", "value": "hello"}]}) + "\n")
    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_staff": True,
                                                                                "is_superuser": True})
    first = run_launch(user=user, target_path=target, dataset_path=chats, config=RunConfig(), name="bench 0",
                       enqueue=False)
    runs = [first] + PipelineRun.objects.bulk_create([
        PipelineRun(owner=user, target=first.target, dataset=first.dataset, name=f"bench {i}", config=first.config,
                    project=first.project) for i in range(1, count)])
    for kind in STAGES:
        row = getattr(first, kind.related_name)
        values = {f.attname: getattr(row, f.attname) for f in kind.model._meta.concrete_fields
                  if f.name not in ("id", "run")}
        kind.model.objects.bulk_create([kind.model(run=r, **values) for r in runs[1:]], batch_size=2000)
    return user, runs, [r.training_run for r in PipelineRun.objects.filter(pk__in=[r.pk for r in runs])
                        .select_related("training_run").order_by("pk")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
