"""Cataloguing a dataset and verifying an extraction run on a worker, not in the request: the
request checks what it can quickly and queues the rest; the page shows the job's state, its error
and a button that starts it again; a lost worker's job is queued again like a stage."""
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.pipeline.jobs import services as job_services
from runs.pipeline import services
from runs.pipeline.jobs.models import DatasetCatalogue, VerificationRequest
from runs.models import Dataset, DatasetSample, PendingEnqueue, PipelineRun
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.services import HEAD_CHECK_CONVERSATIONS
from runs.pipeline.lifecycle.stage_services import MAX_ATTEMPTS, stages_reconcile
from runs.data.extractions import extraction_import
from tests.contract.test_verify import write_flat
from workers.orchestration.tasks import stage_execute

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
        from runs.pipeline.lifecycle.stage_services import stage_start

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

    from runs.pipeline.dispatch import queue

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
    assert "js/data/follow_jobs.js" in page  # the page follows the job while it is unfinished (not while typing)


def test_asking_again_hands_a_queued_job_whose_message_was_lost_to_the_broker_again(
        roots, user, django_capture_on_commit_callbacks, monkeypatch):
    from runs.pipeline.dispatch import queue

    sent = []
    monkeypatch.setattr(queue, "_send", lambda kind, object_id: sent.append((kind, object_id)))
    chats = chat_file(roots / "c.jsonl", rows=10)
    with django_capture_on_commit_callbacks(execute=True):
        dataset = services.dataset_register(path=chats)
    catalogue = dataset.catalogues.get()
    assert sent == [("catalogue", catalogue.pk)] and not PendingEnqueue.objects.exists()
    # Redis restarted without the message: nothing in the outbox, nothing running, the row waits.
    assert stages_reconcile() == []
    with django_capture_on_commit_callbacks(execute=True):
        again = job_services.dataset_catalogue_request(dataset=dataset, user=user)
    assert again == catalogue and sent == [("catalogue", catalogue.pk)] * 2


def test_a_file_grown_while_a_pass_runs_gets_a_pass_of_its_own(roots, user, django_capture_on_commit_callbacks):
    from runs.pipeline.lifecycle.stage_services import stage_start

    chats = chat_file(roots / "c.jsonl", rows=10)
    with django_capture_on_commit_callbacks(execute=False):
        dataset = services.dataset_register(path=chats)
    first = dataset.catalogues.get()
    assert stage_start(stage_name="catalogue", record_id=first.pk, worker="w1")  # running, file read as it was
    chat_file(chats, rows=15)
    with django_capture_on_commit_callbacks(execute=False):
        services.dataset_register(path=chats)
    second = dataset.catalogues.get(status="queued")
    assert second != first


def test_the_second_pass_stops_where_the_check_stopped(roots, user, monkeypatch):
    """Lines appended between the two passes are left to the next pass, not stored unchecked."""
    from runs.data import curation

    chats = chat_file(roots / "c.jsonl", rows=10)
    dataset = Dataset.objects.create(name="c", path=str(chats), size_bytes=chats.stat().st_size)
    real = curation.read_conversations
    calls = []

    def growing(path, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # between the passes, a writer appends a half-written line
            with open(path, "a") as fh:
                fh.write(json.dumps({"id": "late", **GOOD}) + "\n" + '{"id": "torn", "messa')
        return real(path, **kwargs)

    monkeypatch.setattr(curation, "read_conversations", growing)
    counts = curation.dataset_samples_sync(dataset=dataset)
    assert (counts.added, counts.total) == (10, 10)
    assert not DatasetSample.objects.filter(sample_id__in=["late", "torn"]).exists()


def test_the_launch_check_reads_a_bounded_head_even_of_blank_lines(roots, user):
    from runs.pipeline.services import HEAD_CHECK_BYTES, dataset_check_head

    blank = roots / "blank.jsonl"
    with open(blank, "w") as fh:
        fh.write("\n" * (HEAD_CHECK_BYTES + 4096))
        fh.write(json.dumps({"id": "x" * 300, **GOOD}) + "\n")  # bad, but past the head
    assert dataset_check_head(blank) == 0


def test_a_verification_keeps_who_asked_for_it_and_no_override_while_one_is_under_way(
        user, client, tmp_path, config_only_target, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Group

    from runs.data.extractions import verification_override
    from runs.models import Verification
    from workers.contract.errors import InputError

    user.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    extraction, _ = extraction_import(path=write_flat(tmp_path / "e", total_samples=5), target_path=config_only_target)
    assert not extraction.latest_verification.passed  # the manifest claims 5 samples; 4 are there
    with django_capture_on_commit_callbacks(execute=False):
        request = job_services.extraction_verify_request(extraction=extraction, full=False, user=user)
    with pytest.raises(InputError, match="queued or running; wait for its verdict"):
        verification_override(extraction=extraction, user=user, reason="the manifest is wrong")
    client.force_login(user)
    page = client.get(f"/extractions/{extraction.pk}/").content.decode()
    assert 'id="override-waits"' in page and 'name="reason"' not in page
    assert stage_execute(stage_name="verify", record_id=request.pk, worker="test")  # a failed verdict is a done job
    request.refresh_from_db()
    assert request.status == "succeeded" and request.verification.created_by == user
    verification_override(extraction=extraction, user=user, reason="the manifest is wrong")
    assert Verification.objects.get(pk=request.verification.pk).overrides.count() == 1


def test_a_message_for_a_job_or_run_deleted_while_it_waited_is_skipped_without_an_error(
        roots, user, caplog, django_capture_on_commit_callbacks):
    """Staff delete a run or a job in the admin while its message waits in the broker (the demo's worker once
    took a serve check's message left from a deleted one and logged a traceback): the worker says so and drops it."""
    with django_capture_on_commit_callbacks(execute=False):
        run = launch(roots, user, chat_file(roots / "chats.jsonl", rows=3))
    catalogue, preparation = DatasetCatalogue.objects.get(dataset=run.dataset), run.preparation.pk
    catalogue.delete()
    run.delete()
    with caplog.at_level("INFO", logger="workers"):
        assert stage_execute(stage_name="catalogue", record_id=catalogue.pk, worker="test") is False
        assert stage_execute(stage_name="prepare", record_id=preparation, worker="test") is False
    said = [r.getMessage() for r in caplog.records if r.name.startswith("workers")]
    assert f"catalogue {catalogue.pk} is not queued any more (or was deleted); skipping" in said
    assert f"prepare {preparation} is not queued any more (or was deleted); skipping" in said
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
