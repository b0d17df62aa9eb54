"""The runs list's table is cached under its version (runs.pipeline.status.changes.runs_list_version) and never read
stale: each change the list shows moves the version after its commit, a batch of points does not (the table is not
built again for every batch), and on PostgreSQL the version reads the list's change count, not every run's counter.
Transactional: the moves run after the commit, as in production; the cache is never cleared here."""
import pytest
from django.db import connection

from runs.models import PipelineRun, Preparation, StageStatus
from runs.pipeline.status.changes import LIST_CHANGES, runs_list_version, runs_list_version_sql
from runs.projects.bulk import runs_archive, runs_move
from runs.projects.services import project_create
from runs.tracking.services import metrics_record
from tests.views.tracking.test_run_table import launch, names, roots  # noqa: F401  (roots: a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(client) -> dict[str, str]:
    """Each listed run's name and its row's HTML."""
    response = client.get("/")
    assert response.status_code == 200
    return dict(zip(names(response), response.content.decode().split("<tr data-run=")[1:]))


def test_every_change_the_list_shows_moves_its_version_and_a_batch_of_points_does_not(client, user, roots):  # noqa: F811
    client.force_login(user)
    first, second = launch(roots, user, name="first run"), launch(roots, user, name="second run")
    assert set(_rows(client)) == {"first run", "second run"}
    assert ">failed<" not in _rows(client)["first run"]

    version = runs_list_version()
    metrics_record(training_run_id=first.training_run.pk,
                   points=[{"split": "train", "key": "loss", "step": s, "epoch": 0.0, "value": 1.0} for s in range(1, 50)])
    assert runs_list_version() == version  # curves are not the list's: its table stays cached

    Preparation.objects.filter(run=first).update(status=StageStatus.FAILED, error="a stage failed")
    assert runs_list_version() != version
    assert ">failed<" in _rows(client)["first run"]

    launch(roots, user, name="third run")
    assert set(_rows(client)) == {"first run", "second run", "third run"}

    runs_archive(user=user, run_ids=[second.pk])
    assert set(_rows(client)) == {"first run", "third run"}

    PipelineRun.objects.filter(pk=first.pk).delete()  # the admin's delete: not the newest run, no state counter left
    assert set(_rows(client)) == {"third run"}


def _change_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT last_value + is_called::int FROM "{LIST_CHANGES}"')
        return cursor.fetchone()[0]


def test_on_postgresql_the_version_reads_the_lists_change_count_not_every_runs_counter(user, roots):  # noqa: F811
    if connection.vendor != "postgresql":
        pytest.skip("the change count is a PostgreSQL sequence; SQLite (the demo) sums the counters")
    sql = runs_list_version_sql()
    assert LIST_CHANGES in sql and "state_changes" not in sql
    runs = [launch(roots, user, name=f"counted {i}") for i in range(4)]
    before = _change_count()
    Preparation.objects.filter(run=runs[0]).update(status=StageStatus.RUNNING)  # one bump after its commit
    assert _change_count() == before + 1
    other = project_create(user=user, name="elsewhere")
    runs_move(user=user, run_ids=[runs[1].pk], project=other)
    assert _change_count() == before + 2
    PipelineRun.objects.filter(pk__in=[runs[2].pk, runs[3].pk]).delete()  # two runs, one transaction: one move
    assert _change_count() == before + 3
