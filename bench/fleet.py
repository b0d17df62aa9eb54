"""Benchmark (not a test): one run's extraction on 1 and on 2 real Celery workers (issue 36), through the framework.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/h_fleetbench CELERY_BROKER_URL=redis://127.0.0.1:6379/10 \\
        .venv/bin/python bench/fleet.py --json [--conversations 160] [--times 10] [--repeats 1]

Each side is a real run: services.run_launch on PostgreSQL and Redis (the database is created and migrated
if missing), its stages done by `celery worker` processes with distinct -n names (tests.worker.celery_worker),
each one pool slot and one torch thread (EAGLE3WEB_TORCH_THREADS=1, OMP_NUM_THREADS=1). The target is the
tiny demo target (workers.stages.demo.assets), built offline. The run is cancelled once its extraction
has succeeded (vocabulary and training are not what is measured here).
  one_worker   worker "a", `shards` 1: the extraction as one stage, as on one host.
  two_workers  workers "a" and "b", `shards` 2: the extraction split into two StageShard rows, one message each.
rows/s = the extraction's rows / the stage row's wall time (started_at to finished_at: the planning, both
shards with their model loads, the merge). From the shard rows' own started/finished timestamps:
  in_shards_share   the union of the shards' [started_at, finished_at] over the stage's wall time;
  outside_share     the rest: planning and splitting, messages waiting to be taken, the merge;
  merge_share       the last shard's finished_at to the stage's finished_at (the merge and its recording).
ratio = two_workers rows/s / one_worker rows/s. Training across nodes has its own bench (bench/fleet_train.py);
`--with-train` then runs its main (imported, not copied), which prints its own JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/h_fleetbench")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/10")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORKER_ENV = {"EAGLE3WEB_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}


def database_ensure(url: str) -> None:
    """Create the bench's own database if it is missing (the server's `postgres` database answers)."""
    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(work: Path) -> None:
    data_root = work / "data"
    data_root.mkdir(parents=True, exist_ok=True)
    os.environ.update({"EAGLE3WEB_DATA_DIR": str(data_root), "EAGLE3WEB_DATA_ROOTS": str(data_root),
                       "EAGLE3WEB_RUNS_DIR": str(work / "runs"), "EAGLE3WEB_PROGRESS_INTERVAL": "1"})
    database_ensure(os.environ["DATABASE_URL"])
    import django

    django.setup()
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, check=True,
                   capture_output=True, env=os.environ)


def shard_timing(stage, shards: list) -> dict:
    """The stage's wall time and the parts of it inside and outside its shards, from the rows' timestamps."""
    wall = (stage.finished_at - stage.started_at).total_seconds()
    spans = sorted((s.started_at, s.finished_at) for s in shards)
    inside, end = 0.0, None
    for start, stop in spans:  # the union of the shards' intervals: two at once count once
        if end is None or start > end:
            inside += (stop - start).total_seconds()
            end = stop
        elif stop > end:
            inside += (stop - end).total_seconds()
            end = stop
    merge = (stage.finished_at - max(stop for _, stop in spans)).total_seconds() if spans else 0.0
    return {"wall_s": round(wall, 3), "in_shards_share": round(inside / wall, 4) if spans else None,
            "outside_share": round(1 - inside / wall, 4) if spans else None,
            "merge_s": round(merge, 3), "merge_share": round(merge / wall, 4) if spans else None,
            "shards": [{"index": s.index, "rows": s.rows, "worker": s.worker.split("@")[0],
                        "queued_to_start_s": round((s.started_at - s.queued_at).total_seconds(), 3),
                        "seconds": round(s.seconds, 3), "attempts": s.attempts} for s in shards]}


def extraction_on(*, workers: int, shards: int, assets, user, work: Path, conversations: int, dataset: Path) -> dict:
    from runs.models import ExtractStage, Preparation, StageShard, StageStatus
    from runs.pipeline import services
    from runs.pipeline.run_config import RunConfig
    from tests.worker import celery_worker

    logs = [work / f"worker-{chr(97 + i)}-{workers}.log" for i in range(workers)]
    with ExitStack() as stack:
        for i, log in enumerate(logs):
            # Only the first purges: a worker started beside a working one must not drop its messages.
            stack.enter_context(celery_worker(data_root=Path(os.environ["EAGLE3WEB_DATA_DIR"]), log_path=log,
                                              name=chr(97 + i), extra_env=WORKER_ENV, purge=i == 0))
        config = RunConfig(max_seq_len=256, max_samples=conversations, draft_vocab_size=256, epochs=1,
                           ttt_steps=1, eval_prompts=2, eval_max_new_tokens=8, shards=shards)
        run = services.run_launch(user=user, target_path=assets.target_dir, dataset_path=dataset,
                                  config=config)
        deadline = time.monotonic() + 1800
        while True:
            stage = ExtractStage.objects.filter(run=run).first()
            if stage and stage.status in (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"extraction of run {run.pk} not done in 1800 s:\n{logs[0].read_text()[-3000:]}")
            time.sleep(0.5)
        services.run_cancel(run=run, user=user)
    if stage.status != StageStatus.SUCCEEDED:
        raise RuntimeError(f"extraction {stage.status}: {stage.error}")
    rows = Preparation.objects.get(run=run).num_rows
    shard_rows = list(StageShard.objects.filter(run=run, stage="extract").order_by("index"))
    timing = shard_timing(stage, shard_rows)
    plan = (shard_rows[0].queued_at - stage.started_at).total_seconds() if shard_rows else None
    return {"workers": workers, "shard_count": len(shard_rows) or 1, "rows": rows,
            "plan_s": None if plan is None else round(plan, 3),
            "tokens": getattr(stage, "total_tokens", None),
            "rows_per_s": round(rows / timing["wall_s"], 2), **timing}


def chats_scaled(chats: Path, times: int) -> Path:
    """The demo's chats `times` over, each copy with its own ids: rows enough that a shard is seconds of work."""
    out = chats.with_name(f"demo-chats-x{times}.jsonl")
    lines = [json.loads(line) for line in chats.read_text().splitlines() if line.strip()]
    with out.open("w") as f:
        for k in range(times):
            for row in lines:
                f.write(json.dumps({**row, "id": f"{row['id']}-{k}"}) + "\n")
    return out


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--conversations", type=int, default=160)
    parser.add_argument("--times", type=int, default=10, help="copies of the demo's chats (distinct ids)")
    parser.add_argument("--repeats", type=int, default=1, help="one_worker/two_workers pairs, alternating")
    parser.add_argument("--with-train", action="store_true", help="then run bench/fleet_train.py --json")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="eagle3web-fleet-"))).resolve()
    setup_django(work)
    from django.contrib.auth import get_user_model

    from workers.stages.demo.assets import build_demo_assets

    from django.contrib.auth.models import Group

    user, _ = get_user_model().objects.get_or_create(username="fleet-bench")
    user.groups.add(Group.objects.get_or_create(name="launcher")[0])  # the role run_launch asks for
    assets = build_demo_assets(work / "data" / "demo", num_conversations=args.conversations, train_steps=60)
    dataset = chats_scaled(assets.chats_path, args.times)
    result = {"load_average_start": load_average(), "pairs": []}
    for _ in range(args.repeats):
        one = extraction_on(workers=1, shards=1, assets=assets, user=user, work=work,
                            conversations=args.conversations * args.times, dataset=dataset)
        two = extraction_on(workers=2, shards=2, assets=assets, user=user, work=work,
                            conversations=args.conversations * args.times, dataset=dataset)
        result["pairs"].append({"one_worker": one, "two_workers": two,
                                "ratio": round(two["rows_per_s"] / one["rows_per_s"], 3),
                                "load_average": load_average()})
    result["regeneration"] = ("not measured: regenerate(rows=...) exists as a stage function, but the shard "
                              "framework (workers.shard_runners.SHARDABLE) splits only the extraction so far")
    result["load_average_end"] = load_average()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    if args.with_train:  # its own JSON line, from its own main (imported, not copied)
        sys.path.insert(0, str(ROOT / "bench"))
        import fleet_train

        sys.argv = [sys.argv[0], "--json"]
        fleet_train.main()


if __name__ == "__main__":
    main()
