"""train_nodes: checked like the GPU counts against the live workers that take the training's queue (each
holds one rank), from the service, the form and run_pipeline; a refusal names the field and stores nothing."""
from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from runs.models import PendingEnqueue, PipelineRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import RunConfigError
from tests.helpers.fleet import cpu_worker

pytestmark = pytest.mark.django_db


def _launch(user, roots, **config):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64, **config))


@pytest.mark.parametrize(("config", "message"), [
    ({"train_nodes": 0}, "train_nodes must be between 1 and 64, got 0"),
    ({"train_nodes": "2"}, "train_nodes must be a whole number"),
    ({"train_nodes": 2, "hidden_states": "online", "capture_urls": ["http://10.0.0.5:8000"]},
     "train_nodes must be 1 with online hidden states"),
])
def test_run_config_names_a_bad_train_nodes(config, message):
    with pytest.raises(RunConfigError) as caught:
        RunConfig(**config)
    assert caught.value.field == "train_nodes" and message in str(caught.value)


def test_a_launch_asking_more_nodes_than_live_workers_is_refused_and_stores_nothing(user, roots):
    cpu_worker("cpu@host-a")
    before = (PipelineRun.objects.count(), PendingEnqueue.objects.count())
    with pytest.raises(RunConfigError) as caught:
        _launch(user, roots, train_nodes=2)
    assert caught.value.field == "train_nodes"
    assert str(caught.value).startswith("train_nodes 2: each rank needs its own live worker taking gpu"), caught.value
    assert "and 1 does (cpu@host-a)" in str(caught.value)
    assert (PipelineRun.objects.count(), PendingEnqueue.objects.count()) == before
    with pytest.raises(CommandError, match="train_nodes 2: each rank needs its own live worker"):
        call_command("run_pipeline", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"),
                     "--draft-vocab-size", "64", "--train-nodes", "2")

    cpu_worker("cpu@host-b")
    run = _launch(user, roots, train_nodes=2)
    assert run.config["train_nodes"] == 2
    with pytest.raises(RunConfigError, match="^train_nodes 3: .* and 2 do \\(cpu@host-a, cpu@host-b\\)"):
        _launch(user, roots, train_nodes=3)


def test_the_launch_form_marks_train_nodes(client, user, roots):
    cpu_worker("cpu@host-a")
    client.force_login(user)
    page = client.post("/runs/new/", {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"),
                                      "max_seq_len": 512, "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003,
                                      "ttt_steps": 1, "train_nodes": 2, "project": "Default"})
    assert page.status_code == 400 and PipelineRun.objects.count() == 0
    assert "train_nodes 2: each rank needs its own live worker" in page.content.decode()
    assert page.context["form"].errors.get("train_nodes"), page.context["form"].errors



@pytest.mark.django_db(transaction=True)
def test_a_ranks_messages_wait_in_the_outbox_while_the_broker_is_down_then_reach_the_queue(user, roots, tmp_path):
    """A multi-node training's rank messages are hand-overs like any other: a broker (a Redis of its own,
    stopped) that refuses them when nodes_open commits leaves them in the outbox, and the reconcilers'
    outbox_flush puts them on the training's queue once it is back."""
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import TrainingRun
    from runs.pipeline.dispatch import queue
    from runs.pipeline.nodes.services import nodes_open
    from tests.helpers.outage import celery_broker, private_redis
    from tests.services.dispatch.test_message_claims import _queued_in_broker

    for host in "abc":
        cpu_worker(f"cpu@host-{host}")
    with private_redis(log_path=tmp_path / "redis.log") as server, celery_broker(server.url):
        run = _launch(user, roots, train_nodes=3)
        PendingEnqueue.objects.all().delete()  # the launch's own hand-overs: not what is looked at here
        started = timezone.now()
        TrainingRun.objects.filter(run=run).update(status="running", started_at=started)
        training = TrainingRun.objects.get(run=run)
        server.stop()
        rank0 = nodes_open(training_id=training.pk, stage_started_at=started, nodes=3, worker="a@host-a",
                           host="host-a", endpoint="host-a:29500")
        waiting = list(PendingEnqueue.objects.filter(kind="train_rank").order_by("object_id"))
        assert [(p.object_id, p.attempts) for p in waiting] == [(rank0 + 1, 1), (rank0 + 2, 1)]
        assert waiting[0].last_error
        server.start()
        PendingEnqueue.objects.update(created_at=timezone.now() - timedelta(seconds=10))
        queued = [m for m in _queued_in_broker(server) if m[0] == "eagle3web.train_rank"]
        assert queued == []
        assert queue.outbox_flush() == 2 and not PendingEnqueue.objects.exists()
        assert [m for m in _queued_in_broker(server) if m[0] == "eagle3web.train_rank"] == [
            ("eagle3web.train_rank", f"[{rank0 + 1}]"), ("eagle3web.train_rank", f"[{rank0 + 2}]")]
