"""Cataloguing a dataset and verifying an extraction run on a worker, not in the request: the
request checks what it can quickly and queues the rest; the page shows the job's state, its error
and a button that starts it again; a lost worker's job is queued again like a stage."""
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import job_services, services
from runs.job_models import DatasetCatalogue, VerificationRequest
from runs.models import Dataset, DatasetSample, PendingEnqueue, PipelineRun
from runs.run_config import RunConfig
from runs.services import HEAD_CHECK_CONVERSATIONS
from runs.stage_services import MAX_ATTEMPTS, stages_reconcile
from runs.extraction_services import extraction_import
from tests.stages.test_verify import write_flat
from workers.tasks import stage_execute

pytestmark = pytest.mark.django_db
GOOD = {"messages": [{"role": "user", "content": "héllo ✓ 你好"}, {"role": "assistant", "content": "hi " * 50}]}


def chat_file(path, *, rows: int, bad_at: int | None = None):
    lines = [json.dumps({"id": f"c{i}", **GOOD}) for i in range(rows)]
    if bad_at is not None:
        lines[bad_at - 1] = json.dumps({"id": "x" * 300, **GOOD})  # an id longer than the catalogue holds
    path.write_text("\n".join(lines) + "\n")
    return path


def launch(roots, user, chats):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=chats, config=RunConfig(),
                               enqueue=True)


def test_a_bad_line_past_the_head_fails_the_catalogue_naming_it_and_stores_nothing(
        roots, user, client, django_capture_on_commit_callbacks):
    bad_line = HEAD_CHECK_CONVERSATIONS + 500
    chats = chat_file(roots / "long.jsonl", rows=HEAD_CHECK_CONVERSATIONS + 1000, bad_at=bad_line)
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user, chats)  # the head is fine: the launch is accepted at once
    catalogue = DatasetCatalogue.objects.get(dataset=run.dataset)
    assert catalogue.status == "queued" and PendingEnqueue.objects.filter(kind="catalogue").exists()

    assert not stage_execute(stage_name="catalogue", record_id=catalogue.pk, worker="test")
    catalogue.refresh_from_db()
    assert catalogue.status == "failed"
    assert f"{chats}, line {bad_line}: 'id' must be 1..200 characters" in catalogue.error
    assert DatasetSample.objects.count() == 0  # the whole file is checked before anything is stored
    assert catalogue.progress_done <= catalogue.progress_total // 2

    client.force_login(user)
    page = client.get(run.dataset.get_absolute_url()).content.decode()
    assert f"line {bad_line}" in page and "Catalogue again" in page

    chat_file(chats, rows=HEAD_CHECK_CONVERSATIONS + 1000)  # the user fixes the file, presses the button
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(f"/datasets/{run.dataset.pk}/catalogue/", follow=True)
    assert b"Cataloguing long.jsonl on a worker" in response.content
    again = DatasetCatalogue.objects.get(dataset=run.dataset, status="queued")
    assert stage_execute(stage_name="catalogue", record_id=again.pk, worker="test")
    again.refresh_from_db()
    assert (again.samples_added, again.samples_total) == (HEAD_CHECK_CONVERSATIONS + 1000,) * 2
    assert again.progress_done == again.progress_total == 2 * chats.stat().st_size
    assert DatasetSample.objects.filter(dataset=run.dataset).count() == HEAD_CHECK_CONVERSATIONS + 1000


def test_a_bad_line_in_the_head_is_still_refused_at_launch_and_stores_nothing(roots, user):
    chats = chat_file(roots / "bad-head.jsonl", rows=50, bad_at=7)
    with pytest.raises(Exception, match="line 7: 'id' must be"):
        launch(roots, user, chats)
    assert (PipelineRun.objects.count(), Dataset.objects.count(), DatasetCatalogue.objects.count()) == (0, 0, 0)


def test_asking_twice_while_one_is_pending_reuses_it(roots, user, django_capture_on_commit_callbacks):
    chats = chat_file(roots / "c.jsonl", rows=10)
    with django_capture_on_commit_callbacks(execute=False):
        dataset = services.dataset_register(path=chats)
        first = dataset.catalogues.get()
        assert job_services.dataset_catalogue_request(dataset=dataset, user=user) == first
        services.dataset_register(path=chats)  # same size: nothing new to catalogue
    assert DatasetCatalogue.objects.count() == 1 and PendingEnqueue.objects.filter(kind="catalogue").count() == 1


def test_a_catalogue_rerun_keeps_curation_and_adds_only_new_conversations(roots, user, django_capture_on_commit_callbacks):
    chats = chat_file(roots / "c.jsonl", rows=10)
    with django_capture_on_commit_callbacks(execute=False):
        dataset = services.dataset_register(path=chats)
    assert stage_execute(stage_name="catalogue", record_id=dataset.catalogues.get().pk, worker="test")
    DatasetSample.objects.filter(sample_id="c3").update(excluded=True, tags="noisy")
    chat_file(chats, rows=14)
    with django_capture_on_commit_callbacks(execute=False):
        services.dataset_register(path=chats)  # the size changed: a new pass is queued
    second = dataset.catalogues.get(status="queued")
    assert stage_execute(stage_name="catalogue", record_id=second.pk, worker="test")
    second.refresh_from_db()
    assert (second.samples_added, second.samples_total) == (4, 14)
    assert DatasetSample.objects.get(sample_id="c3").tags == "noisy"


def test_a_verification_whose_worker_was_lost_is_queued_again_then_failed_saying_why(
        user, tmp_path, config_only_target, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    extraction, _ = extraction_import(path=write_flat(tmp_path / "e"), target_path=config_only_target)
    with django_capture_on_commit_callbacks(execute=False):
        request = job_services.extraction_verify_request(extraction=extraction, full=True, user=user)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        # A worker took it, then died: its lease lapses.
        from runs.stage_services import stage_start

        assert stage_start(stage_name="verify", record_id=request.pk, worker=f"w{attempt}")
        VerificationRequest.objects.filter(pk=request.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        with django_capture_on_commit_callbacks(execute=False):
            done = stages_reconcile()
        request.refresh_from_db()
        if attempt < MAX_ATTEMPTS:
            assert request.status == "queued" and f"verify {request.pk} queued again" in done[0]
            assert PendingEnqueue.objects.filter(kind="verify", object_id=request.pk).exists()
        else:
            assert request.status == "failed" and "stopped renewing its lease" in request.error
            assert f"gave up after {MAX_ATTEMPTS} attempts" in request.error


def test_the_extraction_page_shows_a_verification_the_broker_refused(
        user, client, tmp_path, config_only_target, monkeypatch, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Group

    from runs import queue

    user.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    extraction, _ = extraction_import(path=write_flat(tmp_path / "e"), target_path=config_only_target)

    def broker_down(kind, object_id):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(queue, "_send", broker_down)
    client.force_login(user)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/extractions/{extraction.pk}/verify/", {"full": "on"})
    page = client.get(f"/extractions/{extraction.pk}/").content.decode()
    assert "Waiting for the broker" in page and "Connection refused" in page
    assert '<meta http-equiv="refresh"' in page  # the page follows the job while it is unfinished
