"""The workers page's "Now" column: each worker's latest system sample from its heartbeat (measured here by
workers.orchestration.system_metrics on this test process), its GPUs only where the sample has them, and what an offline
worker last said; the API gives the same sample."""
from __future__ import annotations

import time

import pytest
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from runs.fleet.models import Worker
from runs.fleet.services import worker_heartbeat, worker_stopped
from workers.orchestration.system_metrics import SystemMeter

pytestmark = pytest.mark.django_db


def _row(client, user, name: str) -> str:
    client.force_login(user)
    html = client.get("/workers/").content.decode()
    return html.split(f'data-worker="{name}"')[1].split("</tr>")[0]


def _beat(name: str, system: dict | None) -> Worker:
    return worker_heartbeat(name=name, hostname="this-host", capabilities={"gpus": [], "cpu_count": 2},
                            queues=["cpu"], started_at=timezone.now(), system=system)


def test_the_page_and_the_api_show_each_workers_latest_sample(client, user):
    meter = SystemMeter()
    first = meter.sample()
    _beat("cpu@this-host", first)
    row = _row(client, user, "cpu@this-host")
    # One read: no rate yet, said as "–", never 0 %.
    assert 'data-system="cpu">CPU –' in row and 'data-system="disk"' not in row
    assert f"Memory {filesizeformat(first['rss_bytes'])}".replace("\xa0", " ") in row.replace("\xa0", " ")
    time.sleep(0.3)
    second = meter.sample()
    _beat("cpu@this-host", None)  # a beat that could not sample keeps the last sample
    assert Worker.objects.get().system == first
    _beat("cpu@this-host", second)
    row = _row(client, user, "cpu@this-host")
    assert f'data-system="cpu">CPU {second["cpu_percent"]:.0f} %' in row and "sampled" in row
    assert 'data-system="disk"' in row and 'data-system="gpu0"' not in row
    client.force_login(user)
    listed = client.get("/api/v1/workers/").json()["workers"][0]
    assert listed["system"] == second
    assert listed["system_at"] == Worker.objects.get().system_at.isoformat()
    assert abs(Worker.objects.get().system_at.timestamp() - second["time"]) < 1e-3

    worker_stopped(name="cpu@this-host")
    assert 'data-system="memory"' in _row(client, user, "cpu@this-host")  # what it last said, with when


def test_gpus_in_a_sample_are_listed_one_per_row(client, user):
    sample = SystemMeter().sample()
    # FAKE figures for two GPUs (no GPU here): how the page words what NVML reports.
    sample["gpus"] = [{"index": 0, "util_percent": 97.0, "memory_used_bytes": 40 * 2**30, "memory_total_bytes": 80 * 2**30},
                      {"index": 1, "memory_used_bytes": 2**30}]
    _beat("gpu@gpu-host", sample)
    row = _row(client, user, "gpu@gpu-host").replace("\xa0", " ")
    assert 'data-system="gpu0">GPU 0 97 % <span class="hint">40.0 GB of 80.0 GB</span>' in row
    assert 'data-system="gpu1">GPU 1 <span class="hint">utilisation unknown</span> <span class="hint">1.0 GB</span>' in row


def test_a_worker_without_a_sample_says_so(client, user):
    _beat("old@old-host", None)
    assert "no sample yet" in _row(client, user, "old@old-host")
