"""A real Celery worker joins the fleet: its heartbeat row appears with what this host can run and
the queues it consumes, a stage routed to a backend it cannot run stays in that backend's queue
instead of reaching it, and a clean shutdown shows it offline at once."""
from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings

from runs.pipeline import services
from runs.fleet.models import Worker
from runs.models import StageStatus
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.fleet import fake_gpu_worker
from tests.contract.test_backends import torch_gpus
from tests.helpers.worker import celery_worker
from workers.contract.host.backends import host_queues

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def test_worker_heartbeats_its_capabilities_and_stops_cleanly(data_root, tmp_path):
    log_path = tmp_path / "worker.log"
    with celery_worker(data_root=data_root, log_path=log_path):
        row = wait_for(lambda: Worker.objects.filter(name__startswith="test-worker-").first(), timeout=30,
                       what="the worker's heartbeat row")
        caps = row.capabilities
        # The GPUs torch sees here (none on the development machines), and what this host runs with them.
        assert caps["gpus"] == torch_gpus() and caps["cpu_count"] >= 1
        assert caps["backends"]["transformers"] is None and caps["backends"]["eagle3web"] is None
        vllm = caps["backends"]["vllm"]
        assert vllm is None or vllm.startswith("vllm is not installed") or vllm == "needs a GPU; this host has none"
        assert caps["backends"]["speculators"] == (None if caps["gpus"] else "needs a GPU; this host has none")
        assert caps["versions"]["torch"] and caps["versions"]["speculators"] == "0.9.0"
        # `-Q cpu,gpu`, plus the queues of what the probe found it can run (none on a host without a
        # GPU or vLLM's CPU build).
        consumed = sorted({"cpu", "gpu", *host_queues(caps)})
        assert row.queues == consumed
        assert row.stopped_at is None and f"consumes {', '.join(consumed)}" in log_path.read_text()
    row.refresh_from_db()
    assert row.stopped_at is not None  # a clean shutdown says so at once


def test_a_vllm_stage_waits_in_its_queue_instead_of_reaching_a_worker_without_vllm(tiny_target, data_root,
                                                                                   tmp_path, user):
    fake_gpu_worker("fake-gpu@fake-gpu-host", gpus=2)  # FAKE: the vLLM host the launch is checked against
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("vllm.2")
    log_path = tmp_path / "worker.log"
    try:
        with celery_worker(data_root=data_root, log_path=log_path):
            run = services.run_launch(
                user=user, target_path=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                config=RunConfig(max_samples=10, max_seq_len=128, draft_vocab_size=64, extraction_backend="vllm",
                                 tensor_parallel_size=2))
            wait_for(lambda: type(run.preparation).objects.get(pk=run.preparation.pk).status == StageStatus.SUCCEEDED,
                     timeout=300, what=f"prepare on the real worker\n{log_path.read_text()[-3000:]}")
            # The chain hands extract to vllm.2, which only a worker with vLLM on 2 GPUs consumes.
            wait_for(lambda: broker.llen("vllm.2") == 1, timeout=30, what="the extract message in vllm.2")
            time.sleep(3)
            run.extract_stage.refresh_from_db()
            assert run.extract_stage.status == StageStatus.QUEUED and run.extract_stage.worker == ""
            assert broker.llen("vllm.2") == 1
    finally:
        broker.delete("vllm.2")
