"""The runs list and compare at scale (issue 28), for bench/tracker/metrics.py --scale-only: not a test.

    .venv/bin/python bench/tracker/metrics.py --scale-only --json

PostgreSQL database `bench_scale` (created and dropped here), --runs-list runs (10,000) made as
scratch_site.make_runs makes them (one launched for real, the rest bulk copies), then spread over five projects
(one open to all, four closed; the benchmark's user, not staff, is a member of two closed ones), with notes,
epochs 1-4, τ between 1.5 and 3.5, a tag on every tenth run and every twentieth archived. The --compare-runs
(50) compared runs finished, each with two checkpoints, a measured acceptance per position and three
curves of 500 points. Timed in this process through Django's test client (server time, no socket):

- runs_list_view: `/?view=<id>` with a saved view (a project, epochs=2, τ ≥ 2, sorted by τ, 7 columns);
  cold: the shared cache emptied before each request (the table built every time), warm: as served
  while no run changes (the table from the cache);
- runs_list_search: `/?q=<a word of some runs' notes>` (PostgreSQL full-text search), cold;
- compare: `/runs/compare/?ids=<the 50>`, cold.

Timed as a web process serves (eagle3web.wsgi): after two untimed rounds of the three requests (a full
garbage collection timed then, with the process's objects tracked and once they are frozen:
`gc_full_collection`), the process's objects frozen out of the garbage collector's generations
(eagle3web.gc_freeze); then the cold requests again with them unfrozen, after one untimed collection (`gc_not_frozen`:
what EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS=0 serves), in the same run.

Each figure: median and p95 wall time of the request, and of the web process's own CPU time (the part
other processes on a shared machine cannot slow down; PostgreSQL's work is in the wall time only).
"""
from __future__ import annotations

import gc
import random
import shutil
import tempfile
import time
from pathlib import Path


def _spread(runs: list, user, viewer) -> dict:
    """Projects, notes, settings, τ, tags and archived flags over the runs, in a few bulk statements."""
    from django.db import connection

    from runs.models import PipelineRun, Project, ProjectMember, RunTag
    from runs.projects.models import default_project_pk

    projects = [Project.objects.get(pk=default_project_pk())] + [
        Project.objects.create(name=f"team {i}", created_by=user) for i in range(4)]
    for project in projects[1:3]:
        ProjectMember.objects.create(project=project, user=viewer, role=ProjectMember.Role.EDITOR)
    ids = [p.pk for p in projects]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_pipelinerun SET project_id = (%s::bigint[])[1 + id %% 5], archived = (id %% 20 = 0), "
            "notes = CASE WHEN id %% 7 = 0 THEN 'warmup doubled, loss spikes near step 300' "
            "ELSE 'baseline schedule, cosine decay' END, "
            "config = jsonb_set(config, '{epochs}', to_jsonb(1 + id %% 4))", [ids])
        cursor.execute("UPDATE runs_trainingrun SET best_tau = 1.5 + (run_id % 100) / 50.0, status = 'succeeded'")
        # What best_decide leaves on the run's row beside it (runs.pipeline.status.list_tau).
        cursor.execute("UPDATE runs_pipelinerun SET list_tau = 1.5 + (id % 100) / 50.0")
        for table in ("runs_preparation", "runs_extractstage", "runs_vocabmapping", "runs_evaluation"):
            cursor.execute(f"UPDATE {table} SET status = 'succeeded'")
    tag = RunTag.objects.create(name="paper")
    RunTag.runs.through.objects.bulk_create([RunTag.runs.through(runtag_id=tag.pk, pipelinerun_id=r.pk)
                                             for r in runs[::10]])
    PipelineRun.objects.filter(pk__in=[r.pk for r in runs]).update(state_changes=1)
    return {"projects": projects}


def _compared(runs: list, count: int) -> list[int]:
    """`count` runs of a project the viewer sees, finished, each with checkpoints, a measurement, curves."""
    from runs.models import Checkpoint, Evaluation, PipelineRun
    from runs.tracking.services import metrics_record

    rng = random.Random(0)
    chosen = list(PipelineRun.objects.filter(project__name="team 0", archived=False)
                  .select_related("training_run").order_by("id")[:count])
    for i, run in enumerate(chosen):
        checkpoints = Checkpoint.objects.bulk_create([
            Checkpoint(training_run=run.training_run, epoch=e, path=f"/bench/{run.pk}/{e}", val_loss=2.0 - e / 10,
                       is_best=e == 1) for e in range(2)])
        # Measured shares differ at every position, as real counts do: no two runs' deltas alike by construction.
        shares = sorted((round(rng.uniform(0.05, 0.9), 4) for _ in range(5)), reverse=True)
        Evaluation.objects.filter(run=run).update(
            tau=1 + sum(shares), checkpoint=checkpoints[1], num_prompts=32, acceptance_per_position=shares)
        metrics_record(training_run_id=run.training_run.pk, points=[
            {"split": split, "key": key, "step": s, "epoch": s / 250, "value": 3.0 - s / 500}
            for split, key in (("train", "loss_0"), ("train", "full_acc_0"), ("val", "loss_0")) for s in range(500)])
    return [r.pk for r in chosen]


def _timed(client, url: str, *, requests: int, cold: bool) -> dict:
    from django.core.cache import cache

    from bench.tracker.scratch_site import stats

    times, cpu = [], []
    for _ in range(requests):
        if cold:
            cache.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)  # this process's CPU alone: PostgreSQL's is not in it
        assert response.status_code == 200, (url, response.status_code, response.content[:300])
    median, p95 = stats(times)
    return {"median_ms": round(median, 1), "p95_ms": round(p95, 1), "requests": requests,
            "python_cpu_ms_median": round(stats(cpu)[0], 1), "python_cpu_ms_p95": round(stats(cpu)[1], 1),
            "rows": response.content.count(b'<tr data-run="'), "bytes": len(response.content)}


def runs_list_timed(*, runs: list, user, count: int, requests: int, workdir: Path) -> dict:
    """bench/tracker/metrics.py's `runs_list_ms`: runs added up to `count` and spread over projects as scale() does, then
    the list with a saved view of a project (the project filter, epochs=2, τ ≥ 2, sorted by τ) as a member of
    two projects sees it: cold (the table built each time) and warm (the table from the cache)."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from bench.tracker.scratch_site import make_runs
    from runs.models import PipelineRun
    from runs.saved_views.services import saved_view_save

    make_runs(max(1, count - len(runs)), workdir=workdir)
    viewer = get_user_model().objects.create_user("bench-viewer", password="bench-password-1")
    _spread(list(PipelineRun.objects.only("pk").order_by("pk")), user, viewer)
    with connection.cursor() as cursor:  # as autovacuum leaves a table the bulk updates above rewrote
        cursor.execute("VACUUM ANALYZE")
    view = saved_view_save(user=viewer, name="team 0, 2 epochs, τ ≥ 2", params={
        "project": "team 0", "settings": "epochs=2", "tau_min": "2", "sort": "-tau",
        "columns": "name,status,tau,epochs,owner,created,tags"})
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(viewer)
    url = f"/?view={view.pk}"
    for _ in range(2):  # what a web process loads once
        client.get(url)
    return {"runs": PipelineRun.objects.count(), "cold": _timed(client, url, requests=requests, cold=True),
            "warm": _timed(client, url, requests=requests, cold=False)}


def scale(args) -> dict:
    from bench.tracker.scratch_site import drop_database, make_runs, recreate_database, setup_django

    setup_django(recreate_database("bench_scale"))
    from django.contrib.auth import get_user_model
    from django.db import connection, connections
    from django.test import Client

    from eagle3web.gc_freeze import freeze
    from runs.saved_views.services import saved_view_save

    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        t0 = time.perf_counter()
        user, runs, _ = make_runs(args.runs_list, workdir=workdir)
        viewer = get_user_model().objects.create_user("bench-viewer", password="bench-password-1")
        _spread(runs, user, viewer)
        compared = _compared(runs, args.compare_runs)
        with connection.cursor() as cursor:  # as autovacuum leaves a table the bulk updates above rewrote
            cursor.execute("VACUUM ANALYZE")
        built_s = time.perf_counter() - t0
        view = saved_view_save(user=viewer, name="team 0, 2 epochs, τ ≥ 2", params={
            "project": "team 0", "settings": "epochs=2", "tau_min": "2", "sort": "-tau",
            "columns": "name,status,tau,epochs,owner,created,tags"})
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(viewer)
        requests = args.scale_requests
        compare_url = "/runs/compare/?ids=" + ",".join(map(str, compared))
        urls = {"runs_list_view": f"/?view={view.pk}", "runs_list_search": "/?q=spikes", "compare": compare_url}
        del runs  # the 10,000 rows this process made: a web process holds none of them
        # As a web process runs (eagle3web.wsgi): its first requests load what serving needs, then
        # gc.freeze() moves it out of the collector's sight (eagle3web.gc_freeze); the warm-up is not timed.
        for url in [*urls.values()] * 2:
            client.get(url)
        gc.collect()
        tracked = len(gc.get_objects())
        t0 = time.perf_counter()
        gc.collect()  # what a full collection costs this process unfrozen ...
        unfrozen_ms = (time.perf_counter() - t0) * 1000
        freeze()
        t0 = time.perf_counter()
        gc.collect()  # ... and once its objects are frozen
        collections = {"tracked_objects": tracked, "not_frozen_ms": round(unfrozen_ms, 1),
                       "frozen_ms": round((time.perf_counter() - t0) * 1000, 1)}
        result = {"runs": args.runs_list, "built_s": round(built_s, 1), "compare_runs": len(compared),
                  "gc_full_collection": collections,
                  "runs_list_view_warm": _timed(client, urls["runs_list_view"], requests=requests, cold=False)}
        for name, url in urls.items():
            result[f"{name}_cold"] = _timed(client, url, requests=requests, cold=True)
        # The same requests with the process's objects back in the collector's generations (what
        # EAGLE3WEB_GC_FREEZE_AFTER_REQUESTS=0 serves), measured in the same run.
        gc.unfreeze()
        gc.collect()  # untimed: the collector's counts start from the objects it sees again, not the frozen phase's
        result["gc_not_frozen"] = {f"{name}_cold": _timed(client, url, requests=requests, cold=True)
                                   for name, url in urls.items()}
        freeze()
        connections.close_all()
        return result
    finally:
        drop_database("bench_scale")
        shutil.rmtree(workdir, ignore_errors=True)
