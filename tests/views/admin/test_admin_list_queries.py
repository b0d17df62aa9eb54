"""Every admin list runs the same number of queries however many rows it shows (issue 40): a column that reads a
related row per row (a nullable foreign key, which Django's automatic select_related() does not follow) took the
runs' list to 209 queries and 280 ms at 100,000 runs. Each list is opened with one run's rows, then with four runs'."""
import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from runs.models import (Checkpoint, Evaluation, PipelineRun, Review, RunTag, StageAttempt, StageStatus,
                         TrainingRun)
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.services import metrics_record

pytestmark = pytest.mark.django_db


def _a_runs_rows(user, roots, number: int) -> None:
    """A launched run and what its stages, its training, its reviewers and staff make of it."""
    run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                              config=RunConfig(), enqueue=False)
    training = run.training_run
    now = timezone.now()
    TrainingRun.objects.filter(pk=training.pk).update(status=StageStatus.SUCCEEDED, started_at=now, finished_at=now)
    StageAttempt.objects.create(run=run, stage="train", record_id=training.pk, number=1, worker="w", started_at=now)
    metrics_record(training_run_id=training.pk, points=[
        {"split": split, "key": key, "step": step, "epoch": 0.0, "value": 1.0 / (step + 1)}
        for split in ("train", "val") for key in ("loss", "full_acc_0") for step in range(3)])
    checkpoint = Checkpoint.objects.create(training_run=training, epoch=0, path=f"/ckpt/{number}", val_loss=1.0)
    Evaluation.objects.filter(run=run).update(checkpoint=checkpoint)  # the evaluate stage measured it
    Checkpoint.objects.create(training_run=None, epoch=0, path=f"/imported/{number}", imported_by=user,
                              imported_at=now)  # imported: no training of ours
    Review.objects.create(author=user, run=run, decision=Review.Decision.APPROVE, text=f"ok {number}")
    Review.objects.create(author=user, checkpoint=checkpoint, decision=Review.Decision.COMMENT, text="see curves")
    RunTag.objects.get_or_create(name=f"tag {number}")[0].runs.add(run)


def _list_queries(client) -> dict[str, int]:
    counts = {}
    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, url
        counts[model._meta.label_lower] = (len(queries.captured_queries), model._default_manager.count())
    return counts


def test_every_admin_list_runs_as_many_queries_for_four_runs_as_for_one(admin_client, admin_user, roots):
    _a_runs_rows(admin_user, roots, 0)
    before = _list_queries(admin_client)
    for number in range(1, 4):
        _a_runs_rows(admin_user, roots, number)
    after = _list_queries(admin_client)
    grown = {label: (before[label][0], after[label][0]) for label in after
             if after[label][1] > before[label][1] and after[label][0] != before[label][0]}
    assert grown == {}, f"queries that grew with the rows (one run's, four runs'): {grown}"
    # The lists that matter most had more rows the second time, else the comparison says nothing of them.
    for label in ("runs.pipelinerun", "runs.checkpoint", "runs.review", "runs.trainingrun", "runs.stageattempt",
                  "runs.metricseries", "runs.metricchunk", "runs.preparation", "runs.extractstage", "runs.evaluation"):
        assert after[label][1] > before[label][1], label


def test_the_admins_run_search_finds_what_the_runs_lists_search_box_finds(admin_client, admin_user, roots,
                                                                          django_user_model):
    """By the same rules and indexes (runs.tracking.runs_list.run_search): a name's part, a word of the notes, the
    owner's name, a tag, the id; a word nowhere finds nothing."""
    def launched(name: str, owner) -> PipelineRun:
        return services.run_launch(user=owner, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                   config=RunConfig(), name=name, enqueue=False)

    carol = django_user_model.objects.create_user("carol-the-owner", password="pw-carol-1")
    named = launched("alpha-ablation", admin_user)
    noted = launched("second", admin_user)
    PipelineRun.objects.filter(pk=noted.pk).update(notes="warmup doubled, loss spikes near step 300")
    owned = launched("third", admin_user)
    PipelineRun.objects.filter(pk=owned.pk).update(owner=carol)  # hers (a viewer may not launch)
    tagged = launched("fourth", admin_user)
    RunTag.objects.create(name="paper-figure").runs.add(tagged)
    url = reverse("admin:runs_pipelinerun_changelist")

    def found(q: str) -> set[int]:
        response = admin_client.get(url, {"q": q})
        assert response.status_code == 200
        return {run.pk for run in response.context["cl"].result_list}

    assert found("ablation") == {named.pk}
    assert found("spikes") == {noted.pk}
    assert found("carol-the") == {owned.pk}
    assert found("paper-figure") == {tagged.pk}
    assert found(str(owned.pk)) >= {owned.pk}
    assert found("nowhere-at-all") == set()
