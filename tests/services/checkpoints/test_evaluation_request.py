"""Asking for a measurement of a checkpoint while one with the same settings is queued or running
returns that one: six clicks on "Measure acceptance length" queue one evaluation, not six."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from runs.pipeline import services
from runs.checkpoints.evaluation import evaluation_request
from runs.models import Checkpoint, Evaluation, PendingEnqueue, StageStatus
from runs.pipeline.launch.run_config import RunConfig


def _checkpoint(user, roots) -> Checkpoint:
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(draft_vocab_size=64), enqueue=False)
    return Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/checkpoints/0")


def _imported_checkpoint(user, roots) -> Checkpoint:
    """One that no launch made (so nothing is handed to the broker): measured on a prompts file."""
    return Checkpoint.objects.create(epoch=0, path=str(roots / "imported"), verifier_path=str(roots / "target"),
                                     imported_by=user, imported_at=timezone.now())


def _standalone(checkpoint) -> list[Evaluation]:
    return list(Evaluation.objects.filter(checkpoint=checkpoint, run=None).order_by("id"))


def _evaluations_enqueued() -> int:
    return PendingEnqueue.objects.filter(kind=PendingEnqueue.Kind.EVALUATION).count()


@pytest.mark.django_db
def test_six_requests_while_one_is_queued_make_one_evaluation_and_enqueue_it_once(user, roots):
    checkpoint = _checkpoint(user, roots)
    before = _evaluations_enqueued()
    answers = [evaluation_request(checkpoint=checkpoint, user=user, max_new_tokens=32) for _ in range(6)]
    first = answers[0][0]
    assert [created for _, created in answers] == [True] + [False] * 5
    assert {e.pk for e, _ in answers} == {first.pk}
    assert _standalone(checkpoint) == [first]
    assert _evaluations_enqueued() == before + 1


@pytest.mark.django_db
def test_a_running_measurement_is_returned_too(user, roots):
    checkpoint = _checkpoint(user, roots)
    first, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    Evaluation.objects.filter(pk=first.pk).update(status=StageStatus.RUNNING, worker="gpu@host")
    again, created = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    assert (again.pk, created, again.status) == (first.pk, False, StageStatus.RUNNING)


@pytest.mark.django_db
def test_the_command_leaves_a_running_measurement_to_its_worker(user, roots):
    checkpoint = _checkpoint(user, roots)
    running, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)  # the command's defaults
    Evaluation.objects.filter(pk=running.pk).update(status=StageStatus.RUNNING, worker="gpu@host")
    with pytest.raises(CommandError, match=rf"^evaluation {running.pk} of checkpoint {checkpoint.pk} with these "
                                           "settings is already running on gpu@host;"):
        call_command("evaluate_checkpoint", str(checkpoint.pk))
    assert _standalone(checkpoint) == [running]


@pytest.mark.django_db
@pytest.mark.parametrize("status", [StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED])
def test_a_finished_measurement_does_not_stop_a_new_one(user, roots, status):
    checkpoint = _checkpoint(user, roots)
    first, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    Evaluation.objects.filter(pk=first.pk).update(status=status)
    again, created = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    assert created and again.pk != first.pk


@pytest.mark.django_db
@pytest.mark.parametrize("other", [{"max_new_tokens": 32}, {"max_prompts": 8}, {"num_speculative_tokens": 2},
                                   {"prompts_path": "chats.jsonl"}])
def test_other_settings_are_another_measurement(user, roots, other):
    checkpoint = _checkpoint(user, roots)
    first, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    if "prompts_path" in other:
        other = {"prompts_path": str(roots / other["prompts_path"])}
    again, created = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False, **other)
    assert created and again.pk != first.pk
    # ... and asking for that one again returns it.
    assert evaluation_request(checkpoint=checkpoint, user=user, enqueue=False, **other) == (again, False)


@pytest.mark.django_db
def test_another_checkpoints_pending_measurement_is_not_returned(user, roots):
    checkpoint = _checkpoint(user, roots)
    other = Checkpoint.objects.create(training_run=checkpoint.training_run, epoch=1, path=f"{checkpoint.path}/../1")
    first, _ = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False)
    again, created = evaluation_request(checkpoint=other, user=user, enqueue=False)
    assert created and again.pk != first.pk and again.checkpoint == other


@pytest.mark.django_db(transaction=True)
def test_requests_at_the_same_moment_make_one_evaluation(user, roots):
    checkpoint = _imported_checkpoint(user, roots)
    clicks = 4
    together = threading.Barrier(clicks)

    def click(_) -> tuple[int, bool]:
        try:
            together.wait()
            evaluation, created = evaluation_request(checkpoint=checkpoint, user=user, enqueue=False,
                                                     prompts_path=str(roots / "chats.jsonl"))
            return evaluation.pk, created
        finally:
            connection.close()  # each thread has its own connection to PostgreSQL

    with ThreadPoolExecutor(clicks) as pool:
        answers = list(pool.map(click, range(clicks)))
    assert len({pk for pk, _ in answers}) == 1 and sorted(c for _, c in answers) == [False] * (clicks - 1) + [True]
    assert len(_standalone(checkpoint)) == 1


@pytest.mark.django_db
def test_the_page_says_the_measurement_is_already_pending(client, user, roots):
    checkpoint = _checkpoint(user, roots)
    client.force_login(user)
    form = {"max_prompts": "4", "max_new_tokens": "16"}
    first = client.post(f"/checkpoints/{checkpoint.pk}/evaluate/", form, follow=True).content.decode()
    evaluation = _standalone(checkpoint)[0]
    assert f"Evaluation {evaluation.pk} queued" in first
    again = client.post(f"/checkpoints/{checkpoint.pk}/evaluate/", form, follow=True).content.decode()
    assert f"Evaluation {evaluation.pk} with these settings is already queued" in again
    assert "no second one was queued" in again
    assert _standalone(checkpoint) == [evaluation]
