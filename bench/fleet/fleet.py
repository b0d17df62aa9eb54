"""Benchmark (not a test): one run's extraction, and a dataset's regeneration, on 1 and on 2 real Celery workers
(issue 36), through the framework.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/h_fleetbench CELERY_BROKER_URL=redis://127.0.0.1:6379/10 \\
        .venv/bin/python bench/fleet/fleet.py --json [--conversations 160] [--times 10] [--repeats 1] \\
        [--regen-conversations 48] [--regen-new-tokens 16]

Each side is a real run: services.run_launch on PostgreSQL and Redis (the database is created and migrated
if missing), its stages done by `celery worker` processes with distinct -n names (tests.helpers.worker.celery_worker),
each one pool slot and one torch thread (EAGLE3WEB_TORCH_THREADS=1, OMP_NUM_THREADS=1). The target is the
tiny demo target (workers.stages.demo.assets), built offline. The run is cancelled once its extraction
has succeeded (vocabulary and training are not what is measured here).
  one_worker   worker "a", `shards` 1: the extraction as one stage, as on one host.
  two_workers  workers "a" and "b", `shards` 2: the extraction split into two StageShard rows, one message each.
rows/s = the extraction's rows / the stage row's wall time (started_at to finished_at: the planning, both
shards with their model loads, the merge). From the shard rows' own started/finished timestamps:
  in_shards_share   the union of the shards' [started_at, finished_at] over the stage's wall time;
  outside_share     the rest: planning and splitting, messages waiting to be taken, the merge;
  merge_share       the last shard's finished_at to the stage's finished_at (the merge, the extraction's
                    verification and the recording); merge_files_share: the merge alone (the manifest's
                    time_split_s.merge, the extraction's files moved and its manifest written).
ratio = two_workers rows/s / one_worker rows/s.
Then, on the same workers (started once per side), a regeneration (Transformers backend, greedy, the first
--regen-conversations of the demo's chats, --regen-new-tokens per reply) with `shards` 1 and 2: rows/s =
its conversations / the job row's wall time, the same shares, and regeneration_ratio. Each side asks with its
own seed (greedy: the same replies) so that it is its own job, not the other side's answered again.
The vLLM launch check is off (EAGLE3WEB_VLLM_PREFLIGHT_SECONDS=0): it is not what is measured.
Training across nodes has its own bench (bench/fleet/fleet_train.py);
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
os.environ.setdefault("EAGLE3WEB_VLLM_PREFLIGHT_SECONDS", "0")
ROOT = Path(__file__).resolve().parents[2]
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


def _wait_finished(model, pk: int, what: str, logs: list[Path]):
    from runs.models import StageStatus

    deadline = time.monotonic() + 1800
    while True:
        row = model.objects.filter(pk=pk).first()
        if row and row.status in (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED):
            return row
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not done in 1800 s:\n{logs[0].read_text()[-3000:]}")
        time.sleep(0.5)


def _workers_idle(count: int, timeout: float = 120) -> None:
    """Until `count` workers answer and none is running a task (a cancelled stage's task ends at its next
    progress report)."""
    from eagle3web.celery import celery_app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = celery_app.control.inspect(timeout=1.0).active() or {}
        if len(active) >= count and not any(active.values()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the workers were still busy after {timeout:.0f} s")


def _side(*, workers: int, shards: int, stage: str, record, rows: int) -> dict:
    from runs.models import StageShard

    shard_rows = list(StageShard.objects.filter(stage=stage, record_id=record.pk).order_by("index"))
    timing = shard_timing(record, shard_rows)
    plan = (shard_rows[0].queued_at - record.started_at).total_seconds() if shard_rows else None
    return {"workers": workers, "shards_asked": shards, "shard_count": len(shard_rows) or 1, "rows": rows,
            "plan_s": None if plan is None else round(plan, 3), "rows_per_s": round(rows / timing["wall_s"], 2),
            **timing}


def extraction_on(*, workers: int, shards: int, assets, user, work: Path, conversations: int, dataset: Path,
                  regen: dict) -> tuple[dict, dict]:
    """(the extraction's figures, the regeneration's) on `workers` fresh workers, `shards` each."""
    from runs.data.regeneration import RegenerationSettings, dataset_regenerate_request
    from runs.models import ExtractStage, Preparation, StageStatus
    from runs.pipeline import services
    from runs.pipeline.jobs.models import DatasetRegeneration
    from runs.pipeline.launch.run_config import RunConfig
    from tests.helpers.worker import celery_worker

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
        while not ExtractStage.objects.filter(run=run).exists():
            time.sleep(0.2)
        stage = _wait_finished(ExtractStage, ExtractStage.objects.get(run=run).pk, f"extraction of run {run.pk}", logs)
        services.run_cancel(run=run, user=user)
        if stage.status != StageStatus.SUCCEEDED:
            raise RuntimeError(f"extraction {stage.status}: {stage.error}")
        extraction = _side(workers=workers, shards=shards, stage="extract", record=stage,
                           rows=Preparation.objects.get(run=run).num_rows)
        # The merge alone (the manifest's own timing), without the verification and the recording after it.
        manifest = json.loads((Path(run.output_dir) / "extraction" / "data_config.json").read_text())
        merge_files = (manifest.get("time_split_s") or {}).get("merge")
        extraction["merge_files_s"] = None if merge_files is None else round(merge_files, 3)
        extraction["merge_files_share"] = (None if merge_files is None else
                                           round(merge_files / extraction["wall_s"], 4))
        # the run's next stage, cancelled, may still hold a worker: not the regeneration's time
        _workers_idle(len(logs))
        asked = RegenerationSettings(backend="transformers", max_new_tokens=regen["new_tokens"], temperature=0.0,
                                     seed=regen["seed"], shards=shards)
        job, queued = dataset_regenerate_request(dataset=regen["dataset"], target=regen["target"], settings=asked,
                                                 user=user)
        if not queued:
            raise RuntimeError(f"regeneration {job.pk} was asked before: not a fresh job")
        job = _wait_finished(DatasetRegeneration, job.pk, f"regeneration {job.pk}", logs)
    if job.status != StageStatus.SUCCEEDED:
        raise RuntimeError(f"regeneration {job.status}: {job.error}")
    return extraction, _side(workers=workers, shards=shards, stage="regenerate", record=job, rows=job.conversations)


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
    parser.add_argument("--regen-conversations", type=int, default=48, help="conversations regenerated")
    parser.add_argument("--regen-new-tokens", type=int, default=16, help="max_new_tokens per reply")
    parser.add_argument("--with-train", action="store_true", help="then run bench/fleet/fleet_train.py --json")
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
    from runs.pipeline import services

    regen_source = work / "data" / "regen-chats.jsonl"
    regen_source.write_text("".join(assets.chats_path.read_text(encoding="utf-8").splitlines(keepends=True)
                                    [:args.regen_conversations]), encoding="utf-8")
    regen = {"dataset": services.dataset_register(path=regen_source), "new_tokens": args.regen_new_tokens,
             "target": services.target_register(path=assets.target_dir)}
    result = {"load_average_start": load_average(), "pairs": []}
    seed = int(time.time())  # a fresh job per side, in a database that keeps earlier benches' jobs
    for _ in range(args.repeats):
        sides = {}
        for workers in (1, 2):
            seed += 1
            sides[workers] = extraction_on(workers=workers, shards=workers, assets=assets, user=user, work=work,
                                           conversations=args.conversations * args.times, dataset=dataset,
                                           regen={**regen, "seed": seed})
        (one, regen_one), (two, regen_two) = sides[1], sides[2]
        result["pairs"].append({"one_worker": one, "two_workers": two,
                                "ratio": round(two["rows_per_s"] / one["rows_per_s"], 3),
                                "regeneration": {"one_worker": regen_one, "two_workers": regen_two},
                                "regeneration_ratio": round(regen_two["rows_per_s"] / regen_one["rows_per_s"], 3),
                                "load_average": load_average()})
    result["load_average_end"] = load_average()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    if args.with_train:  # its own JSON line, from its own main (imported, not copied)
        from bench.fleet import fleet_train

        sys.argv = [sys.argv[0], "--json"]
        fleet_train.main()


if __name__ == "__main__":
    main()
