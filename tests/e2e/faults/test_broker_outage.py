"""Redis really down at launch, no mock: the launch answers, the run waits for the queue, and it runs
once Redis is back (the outbox row the launch left is handed over by the worker's reconciler)."""
import pytest

from runs.models import PendingEnqueue, StageStatus
from tests.e2e.faults.test_worker_faults import wait_until
from tests.helpers.outage import celery_broker, private_redis
from tests.helpers.worker import celery_worker, wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_run_launched_while_redis_is_down_starts_when_it_is_back(client, tiny_target, data_root, tmp_path, user):
    with private_redis(log_path=tmp_path / "redis.log") as redis, celery_broker(redis.url):
        log = tmp_path / "worker.log"
        with celery_worker(data_root=data_root, log_path=log, extra_env={"EAGLE3WEB_STAGE_LEASE_SECONDS": "3"}):
            redis.stop()
            client.force_login(user)
            response = client.post("/runs/new/", {
                "target_path": tiny_target.target_dir, "dataset_path": tiny_target.chats_path, "name": "outage",
                "layer_ids": "", "max_seq_len": 256, "max_samples": 40, "draft_vocab_size": 256, "epochs": 1,
                "lr": 0.0003, "ttt_steps": 2, "eval_prompts": 4, "eval_max_new_tokens": 16,
            }, follow=True)
            assert response.status_code == 200
            page = response.content.decode()
            assert "waiting for the queue (Redis is not answering)" in page
            assert 'id="waiting-for-queue"' in page
            run = response.context["run"]
            pending = PendingEnqueue.objects.get(kind="pipeline", object_id=run.pk)
            assert pending.attempts >= 1 and pending.last_error
            assert run.preparation.status == StageStatus.QUEUED

            redis.start()  # same port, empty: nothing but the outbox knows about the run
            wait_until(lambda: not PendingEnqueue.objects.filter(pk=pending.pk).exists(), timeout=60,
                       what="the reconciler to hand the run over")
            summary = wait_for_run(run.pk, timeout=600, log_path=log)
    assert [s["status"] for s in summary["stages"]] == [StageStatus.SUCCEEDED] * 5, [
        (s["name"], s["status"], s["error"]) for s in summary["stages"]]
    assert "waiting-for-queue" not in client.get(f"/runs/{run.pk}/").content.decode()
