"""System metrics from a real Celery worker process: while it runs a run's stages it samples them into the
run's "system/..." series (by wall time, inside the stages' own times, with plausible figures checked
against psutil's reading of the same processes), and its heartbeat puts its latest sample on the
workers page and the API."""
from __future__ import annotations

import time

import psutil
import pytest

from runs.fleet.models import Worker
from runs.models import MetricSeries, StageStatus
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.lifecycle.stages import STAGES
from runs.tracking.curves import series_points
from tests.e2e.fleet.test_worker_fleet import wait_for
from tests.contract.test_backends import torch_gpus
from tests.helpers.worker import celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOST_KEYS = {"system/cpu_percent", "system/host_cpu_percent", "system/rss_bytes", "system/host_memory_used_bytes",
             "system/disk_read_bytes_per_s", "system/disk_write_bytes_per_s"}


def _tree_rss(proc: psutil.Process) -> int:
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])


def test_a_worker_samples_the_stages_it_runs_and_heartbeats_its_latest_sample(tiny_target, data_root, tmp_path,
                                                                              user, client):
    log_path = tmp_path / "worker.log"
    env = {"EAGLE3WEB_SYSTEM_SAMPLE_SECONDS": "1", "EAGLE3WEB_STAGE_LEASE_SECONDS": "6"}  # heartbeat every 3 s
    with celery_worker(data_root=data_root, log_path=log_path, extra_env=env) as proc:
        worker = psutil.Process(proc.pid)
        # Its second heartbeat has the rates (the first read has nothing to compare with).
        row = wait_for(lambda: Worker.objects.filter(name__startswith="test-worker-",
                                                     system__has_key="cpu_percent").first(),
                       timeout=30, what=f"a heartbeat with a CPU figure\n{log_path.read_text()[-2000:]}")
        now = row.system
        assert now["cpu_count"] == psutil.cpu_count() and 0 <= now["cpu_percent"] <= 100 * psutil.cpu_count()
        assert 0.5 < now["rss_bytes"] / _tree_rss(worker) < 2  # the main process and its pool, seconds ago
        assert 0 < now["host_memory_used_bytes"] <= now["host_memory_total_bytes"] == psutil.virtual_memory().total
        assert ("gpus" in now) == bool(torch_gpus())

        client.force_login(user)
        listed = {w["name"]: w for w in client.get("/api/v1/workers/").json()["workers"]}
        assert listed[row.name]["system"]["cpu_count"] == psutil.cpu_count()
        assert listed[row.name]["system_at"] is not None
        page = client.get("/workers/").content.decode().split(f'data-worker="{row.name}"')[1].split("</tr>")[0]
        assert 'data-system="cpu"' in page and 'data-system="memory"' in page and "sampled" in page

        run = services.run_launch(user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                                  config=RunConfig(max_samples=40, max_seq_len=256, draft_vocab_size=256))
        extract = type(run.extract_stage)
        wait_for(lambda: extract.objects.get(pk=run.extract_stage.pk).status == StageStatus.SUCCEEDED,
                 timeout=300, what=f"prepare and extract on the real worker\n{log_path.read_text()[-3000:]}")
        pool = worker.children()[0]  # --concurrency 1: the process that ran the stages
        pool_rss = _tree_rss(pool)
        services.run_cancel(run=run, user=user)  # a stage it runs now (vocab) stops at its next progress report

        def idle() -> bool:  # every task it took has returned: no sampler runs any more
            log = log_path.read_text()
            return log.count("] received") == log.count("] succeeded in") + log.count("] raised unexpected")

        wait_for(idle, timeout=120, what=f"the worker to finish its tasks\n{log_path.read_text()[-3000:]}")
        idle_at = time.time()
        stages = [stage.model.objects.get(run=run) for stage in STAGES]

    series = {s.key: s for s in MetricSeries.objects.filter(training_run__run=run, split="system")}
    assert HOST_KEYS <= set(series), sorted(series)
    gpu_keys = {key for key in series if key.startswith("system/gpu")}
    if not torch_gpus():
        assert gpu_keys == set()  # no GPU here: no GPU series, not zeros
    else:
        assert "system/gpu0_memory_used_bytes" in gpu_keys

    # Every point falls within one of the stages it was sampled in, on the wall-clock axis the curves use.
    # A cancelled stage's row finished when the user cancelled; its task went on to its next progress report.
    windows = [(s.started_at.timestamp() - 1, (s.finished_at.timestamp() if s.status == StageStatus.SUCCEEDED
                                               else idle_at) + 2) for s in stages if s.started_at]
    extract_window = windows[1]
    cpu = series_points(series=series["system/cpu_percent"])
    for key in ("system/cpu_percent", "system/rss_bytes"):
        stored = series_points(series=series[key])
        assert stored.steps.tolist() == [int(t * 1000) for t in stored.times.tolist()]
        assert all(any(lo <= t <= hi for lo, hi in windows) for t in stored.times.tolist()), key
    # One CPU figure a second of each stage it ran (the start has none: a rate needs two reads), and one more
    # at a stage's end after half a second. Each tick waits a period after the last write ended and the sampler
    # starts just after the stage's row: on a loaded host (writes and a start of up to a quarter second) a stage
    # of d seconds has at least floor((d - 0.25) / 1.25), however long it took (here prepare 4.3 s, extract 0.5).
    ran = stages[:2]
    assert [s.status for s in ran] == [StageStatus.SUCCEEDED] * 2
    for stage in ran:
        start, end = stage.started_at.timestamp(), stage.finished_at.timestamp()
        figures = [t for t in cpu.times.tolist() if start <= t <= end + 0.5]
        assert len(figures) >= int((end - start - 0.25) / 1.25), (type(stage).__name__, end - start, figures)
    both = [v for t, v in zip(cpu.times.tolist(), cpu.values.tolist())
            if ran[0].started_at.timestamp() <= t <= ran[1].finished_at.timestamp() + 0.5]
    assert len(both) >= 2, both  # loading torch and the target in a fresh worker lasts beyond a second anywhere
    assert 0 <= cpu.values.min() and cpu.values.max() <= 100 * psutil.cpu_count()
    assert max(both) > 10  # loading a model and running it keeps a core busy
    rss = series_points(series=series["system/rss_bytes"])
    last_rss = [v for t, v in zip(rss.times.tolist(), rss.values.tolist()) if t <= extract_window[1]][-1]
    assert 0.5 < last_rss / pool_rss < 2, (last_rss, pool_rss)  # the stage's process, read again after it
    assert time.time() - rss.times.max() < 600
