"""Hand-overs between stages and messages a worker took but never ran (runs.pipeline.dispatch.message_claims),
against PostgreSQL and a real Redis of the test's own; the workers themselves are in
tests/e2e/faults/test_lost_messages.py.

Each test names the worker state it builds (a heartbeat row written here, as a worker's thread would)
and checks what the reconciler does about it: the outbox rows it writes are what the broker is handed."""
from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import pytest
import redis as redis_client
from django.db import DatabaseError, connection
from django.utils import timezone

from runs.fleet.models import Worker
from runs.models import PendingEnqueue, PipelineRun, StageStatus
from runs.pipeline.jobs.models import DatasetCatalogue
from runs.pipeline.dispatch.message_claims import (
    BROKER_MARK_KEY,
    CLAIM_SECONDS,
    broker_forgot_messages,
    claims_reconcile,
    message_claim,
    message_claim_drop,
)
from runs.pipeline.dispatch.queue import STAGE_TASK, run_next_stage
from runs.pipeline.lifecycle.stage_services import HAND_OVER_NEXT, stage_record_id, stage_start, stage_succeed
from workers.orchestration.claims import broker_mark_check
from tests.helpers.outage import celery_broker, private_redis, tcp_proxy
from tests.services.launch.test_run_launch import launch

pytestmark = pytest.mark.django_db

STAGE = STAGE_TASK


def _launched(roots, user) -> PipelineRun:
    run = launch(roots, user)
    PendingEnqueue.objects.all().delete()  # as if the broker had taken the launch's hand-overs
    return run


def _worker(name: str, *, last_seen_ago: float, started_ago: float = 3600, stopped: bool = False) -> Worker:
    now = timezone.now()
    return Worker.objects.create(name=name, hostname="h", capabilities={}, queues=["cpu", "gpu"],
                                 started_at=now - timedelta(seconds=started_ago),
                                 last_seen=now - timedelta(seconds=last_seen_ago),
                                 stopped_at=now if stopped else None)


def _lapse_claim(run, stage: str = "prepare") -> None:
    """The claim made CLAIM_SECONDS + 1 s ago: the reconciler asks after its worker now."""
    model = type(getattr(run, {"prepare": "preparation", "extract": "extract_stage"}[stage]))
    model.objects.filter(run=run).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _sent() -> list[tuple[str, int]]:
    return list(PendingEnqueue.objects.order_by("id").values_list("kind", "object_id"))


def test_a_worker_that_takes_a_message_names_itself_on_the_queued_row_only(roots, user):
    run = _launched(roots, user)
    assert message_claim(task_name=STAGE, args=["prepare", run.pk], worker="cpu@a")
    run.preparation.refresh_from_db()
    assert run.preparation.status == StageStatus.QUEUED and run.preparation.worker == "cpu@a"
    assert 0 < (run.preparation.lease_expires_at - timezone.now()).total_seconds() <= CLAIM_SECONDS
    stage_start(stage_name="prepare", record_id=run.preparation.pk, worker="cpu@a")
    # A copy of the message later (the broker's visibility timeout) claims nothing: the stage runs.
    assert not message_claim(task_name=STAGE, args=["prepare", run.pk], worker="cpu@b")
    run.preparation.refresh_from_db()
    assert run.preparation.worker == "cpu@a" and run.preparation.status == StageStatus.RUNNING
    for foreign in (("nope", run.pk), ("prepare",), ("prepare", "x")):  # not a message of ours: no row, no error
        assert not message_claim(task_name=STAGE, args=foreign, worker="cpu@a")


@pytest.mark.parametrize("dead", ["no heartbeat for a minute", "stopped", "restarted since", "never heartbeat"])
def test_a_queued_stage_claimed_by_a_dead_worker_is_sent_again_and_the_page_says_why(roots, user, dead):
    run = _launched(roots, user)
    message_claim(task_name=STAGE, args=["prepare", run.pk], worker="cpu@dead")
    if dead == "no heartbeat for a minute":
        _worker("cpu@dead", last_seen_ago=60)
    elif dead == "stopped":
        _worker("cpu@dead", last_seen_ago=1, stopped=True)
    elif dead == "restarted since":  # same node name, started after its claim: it forgot the message
        _worker("cpu@dead", last_seen_ago=1, started_ago=0)
    _lapse_claim(run)
    done = claims_reconcile()
    assert done == [f"prepare {run.preparation.pk}: worker cpu@dead took this stage's message and was lost before "
                    "starting it (no heartbeat since); sent to the queue again"]
    assert _sent() == [("pipeline", run.pk)] and run_next_stage(run_id=run.pk) == "prepare"
    run.preparation.refresh_from_db()
    assert run.preparation.worker == "" and run.preparation.lease_expires_at is None
    assert "cpu@dead took this stage's message and was lost" in run.preparation.log_tail
    assert claims_reconcile() == []  # once: the claim is gone


def test_a_live_workers_lapsed_claim_is_renewed_and_nothing_is_sent(roots, user):
    run = _launched(roots, user)
    _worker("cpu@busy", last_seen_ago=2)
    message_claim(task_name=STAGE, args=["prepare", run.pk], worker="cpu@busy")
    _lapse_claim(run)
    assert claims_reconcile() == [] and _sent() == []
    run.preparation.refresh_from_db()
    assert run.preparation.worker == "cpu@busy" and run.preparation.lease_expires_at > timezone.now()


def test_a_claim_dropped_by_a_stage_that_waits_for_an_earlier_one_is_not_sent_again(roots, user):
    run = _launched(roots, user)
    message_claim(task_name=STAGE, args=["extract", run.pk], worker="gpu@a")  # a copy that came early
    message_claim_drop(task_name=STAGE, args=["extract", run.pk], worker="gpu@a")
    _lapse_claim(run, "extract")
    assert claims_reconcile() == [] and _sent() == []


def test_a_success_hands_over_the_next_stage_in_its_own_transaction_only_for_the_workers(roots, user):
    run = _launched(roots, user)
    record = stage_record_id(stage_name="prepare", run_id=run.pk)
    started = stage_start(stage_name="prepare", record_id=record, worker="cpu@a")
    token = HAND_OVER_NEXT.set(True)
    try:
        with pytest.raises(RuntimeError):  # the recording transaction fails after the success: nothing handed over
            from django.db import transaction

            with transaction.atomic():
                stage_succeed(stage_name="prepare", record_id=record, fields={}, log_tail="", started_at=started.started_at)
                raise RuntimeError("the result could not be written")
        assert _sent() == []
        stage_succeed(stage_name="prepare", record_id=record, fields={}, log_tail="", started_at=started.started_at)
    finally:
        HAND_OVER_NEXT.reset(token)
    assert _sent() == [("pipeline", run.pk)] and run_next_stage(run_id=run.pk) == "extract"

    other = _launched(roots, user)  # run_pipeline --inline and single-stage callers hand nothing over
    record = stage_record_id(stage_name="prepare", run_id=other.pk)
    started = stage_start(stage_name="prepare", record_id=record, worker="inline")
    stage_succeed(stage_name="prepare", record_id=record, fields={}, log_tail="", started_at=started.started_at)
    assert _sent() == [] and run_next_stage(run_id=other.pk) == "extract"


def test_a_broker_that_came_back_empty_gets_every_handed_over_message_again_once(roots, user, tmp_path):
    running, waiting, in_outbox = _launched(roots, user), _launched(roots, user), _launched(roots, user)
    stage_start(stage_name="prepare", record_id=running.preparation.pk, worker="cpu@a")
    type(waiting.preparation).objects.filter(pk=waiting.preparation.pk).update(status=StageStatus.SUCCEEDED)
    PendingEnqueue.objects.create(kind="pipeline", object_id=in_outbox.pk)  # delivered when the outbox is flushed
    with private_redis(log_path=tmp_path / "redis.log") as server:
        client = redis_client.Redis.from_url(server.url)
        catalogue = DatasetCatalogue.objects.get(status=StageStatus.QUEUED)  # the dataset the launches registered
        assert broker_forgot_messages(client) == [
            f"the broker lost its messages: sent again catalogue {catalogue.pk}, extract of run {waiting.pk}"]
        assert sorted(_sent()) == sorted([("pipeline", in_outbox.pk), ("catalogue", catalogue.pk),
                                          ("pipeline", waiting.pk)])
        assert broker_forgot_messages(client) == []  # the mark is set: the next reconciler sends nothing
        server.stop()
        server.start()  # empty, as a Redis without its append-only file comes back
        PendingEnqueue.objects.filter(object_id=waiting.pk).delete()
        assert broker_forgot_messages(client) != [] and client.exists(BROKER_MARK_KEY)


def _queued_in_broker(server) -> list[tuple[str, str]]:
    """(task, its arguments) of every message the broker's queues hold, read from its Redis."""
    client = redis_client.Redis.from_url(server.url)
    keys = [k for k in client.keys("*") if client.type(k) == b"list"]
    return sorted((message["headers"]["task"], message["headers"]["argsrepr"])
                  for key in keys for message in map(json.loads, client.lrange(key, 0, -1)))


@contextmanager
def _database_through(proxy) -> Iterator[None]:
    """This process's database connection reaches PostgreSQL through `proxy` for the block."""
    before = (connection.settings_dict["HOST"], connection.settings_dict["PORT"])
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(HOST=before[0], PORT=before[1])


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_came_back_empty_while_the_database_was_away_is_sent_again_on_the_next_healthy_tick(
        roots, user, tmp_path):
    db = connection.settings_dict
    with private_redis(log_path=tmp_path / "redis.log") as server, celery_broker(server.url), \
            tcp_proxy(upstream=(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))) as proxy, \
            _database_through(proxy):
        assert broker_mark_check() == []  # a tick marks a new broker (nothing was owed yet)
        assert redis_client.Redis.from_url(server.url).exists(BROKER_MARK_KEY)
        run = launch(roots, user)
        catalogue = DatasetCatalogue.objects.get(status=StageStatus.QUEUED)
        owed = [("eagle3web.job", f"['catalogue', {catalogue.pk}]"), ("eagle3web.stage", f"['prepare', {run.pk}]")]
        assert _queued_in_broker(server) == owed  # the launch's two hand-overs, delivered on commit
        assert broker_mark_check() == []

        # A host reboot: Redis comes back empty while PostgreSQL is still away.
        proxy.cut()
        server.stop()
        server.start()
        assert _queued_in_broker(server) == []
        with pytest.raises(DatabaseError):
            broker_mark_check()  # a reconciler tick meanwhile
        proxy.restore()
        connection.close()  # what the reconciler's close_old_connections does with a broken connection

        assert broker_mark_check() == [
            f"the broker lost its messages: sent again catalogue {catalogue.pk}, prepare of run {run.pk}"]
        assert _queued_in_broker(server) == owed
        assert broker_mark_check() == []  # once
