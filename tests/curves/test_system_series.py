"""A run's system series (runs.tracking.system_series): the samples a worker measures
(workers.orchestration.system_metrics) stored by time, kept apart from the training's curves, and the meter's figures
checked against work of known size done by a child process."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from runs.tracking.curves import CurveQuery, curve_window, run_series_summaries, series_points
from runs.tracking.services import metrics_record, metrics_truncate, system_samples_record
from runs.models import MetricSeries
from tests.curves.test_metric_store import points, training  # noqa: F401 - the fixture
from workers.contract.errors import InputError
from workers.orchestration.system_metrics import ProcessTreeMeter, SystemMeter, series_values

pytestmark = pytest.mark.django_db


def _measured_samples(n: int) -> list[dict]:
    """n samples of this test process, 0.2 s apart, as a stage's sampler writes them."""
    meter, samples = SystemMeter(), []
    for _ in range(n):
        sample = meter.sample()
        samples.append({"time": sample["time"], "values": series_values(sample)})
        time.sleep(0.2)
    return samples


def test_samples_are_stored_by_time_beside_the_curves_and_kept_out_of_them(client, user, training):  # noqa: F811
    metrics_record(training_run_id=training.pk, points=points(range(1, 6), [5, 4, 3, 2, 1]))
    samples = _measured_samples(3)
    kept = system_samples_record(training_run_id=training.pk, samples=samples)
    # The first sample has no rates (CPU, disk: they need two reads); the others have them.
    assert kept == sum(len(s["values"]) for s in samples) and "system/cpu_percent" not in samples[0]["values"]
    rss = MetricSeries.objects.get(training_run=training, split="system", key="system/rss_bytes")
    stored = series_points(series=rss)
    assert stored.steps.tolist() == [int(s["time"] * 1000) for s in samples]
    assert stored.times.tolist() == [s["time"] for s in samples]
    own = psutil.Process().memory_info().rss
    assert all(0.5 * own < value < 2 * own for value in stored.values)  # this process, sampled moments ago
    cpu = MetricSeries.objects.get(training_run=training, split="system", key="system/cpu_percent")
    assert cpu.num_points == 2 and 0 <= cpu.min_value <= cpu.max_value <= 100 * psutil.cpu_count()

    # The default curves read, the compare table and a resumed training's truncation leave them alone.
    assert {s["split"] for s in curve_window(training_run_id=training.pk, query=CurveQuery())} == {"train"}
    assert {s["split"] for s in run_series_summaries(training_run_ids=[training.pk])[training.pk]} == {"train"}
    assert metrics_truncate(training_run_id=training.pk, after_step=2) == 3
    assert MetricSeries.objects.get(pk=rss.pk).num_points == 3

    client.force_login(user)
    url = f"/api/v1/runs/{training.run_id}/metrics/"
    body = client.get(url, {"split": "system"}).json()
    assert {s["key"] for s in body["series"]} == set().union(*(s["values"] for s in samples))
    assert {s["split"] for s in client.get(url).json()["series"]} == {"train"}
    export = client.get(f"{url}export/", {"key": "system/rss_bytes", "split": "system", "format": "csv"})
    assert export.status_code == 200 and len(b"".join(export.streaming_content).splitlines()) == 4
    assert client.get(url, {"split": "systems"}).json()["error"].startswith("split must be")


def test_a_sample_under_a_key_outside_system_stores_nothing(training):  # noqa: F811
    with pytest.raises(InputError, match="does not start with 'system/'"):
        system_samples_record(training_run_id=training.pk, samples=[
            {"time": time.time(), "values": {"system/rss_bytes": 1.0, "loss_0": 2.0}}])
    assert not MetricSeries.objects.exists()


def test_a_child_that_burns_one_cpu_second_and_writes_20_mb_is_counted(tmp_path):
    meter = ProcessTreeMeter()
    first = meter.read()
    target = tmp_path / "written.bin"
    # Born after the first read: all it does falls between the two reads. It stays alive until told to go
    # (a process that ended is not counted).
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        "while time.process_time() < 1.0: pass\n"
        f"f = open({str(target)!r}, 'wb'); f.write(b'x' * 20_000_000); f.flush(); os.fsync(f.fileno()); f.close()\n"
        "print('done', flush=True); sys.stdin.readline()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        second = meter.read()
    finally:
        child.communicate("\n", timeout=30)
    elapsed = second["time"] - first["time"]
    cpu_seconds = second["cpu_percent"] / 100 * elapsed
    assert 0.95 <= cpu_seconds < 1.6, (cpu_seconds, elapsed)  # its second (to the clock tick), its start-up, our reads
    written = second["disk_write_bytes_per_s"] * elapsed
    assert 20_000_000 <= written < 24_000_000, written
    assert second["rss_bytes"] > first["rss_bytes"]  # the child's memory joined the tree
    assert 0 < second["host_memory_used_bytes"] <= second["host_memory_total_bytes"] == psutil.virtual_memory().total
    assert 0 <= second["host_cpu_percent"] <= 100


def test_gpu_figures_become_one_series_per_gpu_and_figure():
    sample = {"time": 1.0, "cpu_count": 8, "cpu_percent": 150.0, "rss_bytes": 10,
              "gpus": [{"index": 0, "util_percent": 97.0, "memory_used_bytes": 5, "memory_total_bytes": 80},
                       {"index": 1, "memory_used_bytes": 7}]}
    assert series_values(sample) == {"system/cpu_percent": 150.0, "system/rss_bytes": 10,
                                     "system/gpu0_util_percent": 97.0, "system/gpu0_memory_used_bytes": 5,
                                     "system/gpu1_memory_used_bytes": 7}
