"""The tracker's hot paths ask the database a fixed number of questions whatever the number of series,
rules or runs (issue 40): a batch of points (runs.tracking.services.metrics_record, its change counters
and its alert check included; and a batch a client posts to the API), a curve read and the live status
poll. 1 series and 20 cost the same, no rules and six the same, one run and eleven the same, so a query
per series, per rule or per run fails here. Transactional: the counters' bump runs after commit, as
in production, and is counted. The runs list's count is pinned in tests/views/tracking/test_list_queries.py and
test_projects_and_views.py."""
from __future__ import annotations

import math

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from runs.alerts import services as alert_services
from runs.alerts.models import Alert
from runs.alerts.services import RuleInput
from runs.models import MetricChunk, MetricSeries, PipelineRun
from runs.pipeline import services
from runs.pipeline.launch.external import external_run_create
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.chunks import CHUNK_POINTS
from runs.tracking import services as services_module
from runs.tracking.curves import series_points
from runs.tracking.reported_points import points_report
from runs.tracking.services import metrics_record

pytestmark = pytest.mark.django_db(transaction=True)

# Steady state: BEGIN, the batch's series locked, one statement that inserts its chunks, bumps the run's counters
# (the run's row then held only until the commit) and updates its summaries, COMMIT.
BATCH_QUERIES = 4


def _run(user, roots, name):
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(), name=name, enqueue=False)


def _batch(keys, steps, *, nan_in=()):
    return [{"split": "train", "key": key, "step": s, "epoch": s / 1000,
             "value": math.nan if key in nan_in and s == steps[-1] else 1.0 / s} for key in keys for s in steps]


def _queries(**kwargs) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        metrics_record(**kwargs)
    return [q["sql"] for q in ctx.captured_queries]


@pytest.fixture
def rules(user):
    """Rules of every kind the write path could ask about, several of them: none may cost a query per batch."""
    for _ in range(3):
        alert_services.rule_create(user=user, data=RuleInput(event="loss_nan"))
        alert_services.rule_create(user=user, data=RuleInput(event="tau_below", threshold=2.0))


def test_a_batch_of_points_costs_the_same_queries_for_1_series_and_20_with_rules(user, roots, rules):
    one, many = _run(user, roots, "one series").training_run.pk, _run(user, roots, "twenty").training_run.pk
    keys = [f"loss_{i}" for i in range(20)]
    first = (_queries(training_run_id=one, points=_batch(keys[:1], [1, 2])),
             _queries(training_run_id=many, points=_batch(keys, [1, 2])))
    assert len(first[0]) == len(first[1]) == BATCH_QUERIES + 2  # a series' first batch also makes its row
    steady = (_queries(training_run_id=one, points=_batch(keys[:1], range(3, 103))),
              _queries(training_run_id=many, points=_batch(keys, range(3, 103))))
    assert len(steady[0]) == len(steady[1]) == BATCH_QUERIES, steady[1]
    # A batch that fills a chunk merges the open ones: their delete is part of the one statement, the open points
    # written from this process's memory of them (services._open_known); a process that does not know them reads
    # them back, once.
    full = range(103, 103 + CHUNK_POINTS)
    merged = (_queries(training_run_id=one, points=_batch(keys[:1], full)),
              _queries(training_run_id=many, points=_batch(keys, full)))
    assert len(merged[0]) == len(merged[1]) == BATCH_QUERIES, merged[1]
    assert "DELETE" in merged[1][2] and "DELETE" not in steady[1][2]
    # What was written is what a batch at a time would have written.
    for series in MetricSeries.objects.filter(training_run_id=many):
        assert (series.num_points, series.first_step, series.last_step) == (102 + CHUNK_POINTS, 1, 102 + CHUNK_POINTS)
        assert (series.open_points, series.open_chunks) == (102, 1)
        chunks = list(series.chunks.order_by("first_step").values_list("first_step", "last_step", "num_points"))
        assert chunks == [(1, CHUNK_POINTS, CHUNK_POINTS), (CHUNK_POINTS + 1, 102 + CHUNK_POINTS, 102)]
    run = PipelineRun.objects.get(training_run__pk=many)
    assert run.curve_changes == 3  # once per batch, not once per series
    assert not Alert.objects.exists()
    # Another worker process (no memory of the open points) reads them back: one query for all series.
    services_module._open.clear()
    later = range(103 + CHUNK_POINTS, 103 + 2 * CHUNK_POINTS)
    assert len(_queries(training_run_id=many, points=_batch(keys, later))) == BATCH_QUERIES + 1
    for series in MetricSeries.objects.filter(training_run_id=many):
        assert series_points(series=series).steps.tolist() == list(range(1, 103 + 2 * CHUNK_POINTS))


def test_a_batch_of_1000_points_costs_the_same_queries_without_rules_and_with_six_and_among_eleven_runs(user, roots):
    bare = _run(user, roots, "no rules").training_run.pk
    keys = [f"loss_{i}" for i in range(5)]
    metrics_record(training_run_id=bare, points=_batch(keys, [1]))
    alone = _queries(training_run_id=bare, points=_batch(keys, range(2, 202)))  # 1,000 points, 5 series
    # Six rules of the run's owner, ten more runs with curves of their own, and the same batch again.
    for _ in range(3):
        alert_services.rule_create(user=user, data=RuleInput(event="loss_nan"))
        alert_services.rule_create(user=user, data=RuleInput(event="tau_below", threshold=2.0))
    for i in range(10):
        beside = _run(user, roots, f"beside {i}").training_run.pk
        metrics_record(training_run_id=beside, points=_batch(keys, range(1, 202)))
    among = _queries(training_run_id=bare, points=_batch(keys, range(202, 402)))
    assert len(alone) == len(among) == BATCH_QUERIES, among
    assert MetricSeries.objects.get(training_run_id=bare, key="loss_4").num_points == 401


def _post_count(client, run_id: int, points: list[dict]) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(f"/api/v1/runs/{run_id}/metrics/", {"points": points}, content_type="application/json")
    assert response.status_code == 200, response.content[:300]
    assert response.json()["accepted"] == len(points)
    return len(ctx)


def test_a_batch_posted_to_the_api_costs_the_same_queries_for_1_series_and_5(client, user, rules):
    client.force_login(user)
    one, five = (external_run_create(user=user, name=name, config={"epochs": 1}) for name in ("one", "five"))
    keys = [f"loss_{i}" for i in range(5)]
    first = (_post_count(client, one.pk, _batch(keys[:1], [1, 2])), _post_count(client, five.pk, _batch(keys, [1, 2])))
    assert first[0] == first[1]
    steady = (_post_count(client, one.pk, _batch(keys[:1], range(3, 203))),
              _post_count(client, five.pk, _batch(keys, range(3, 203))))
    assert steady[0] == steady[1] < first[0]
    series = MetricSeries.objects.get(training_run__run=five, key="loss_4")
    assert (series.num_points, series.last_step, series.open_points) == (202, 202, 202)
    assert PipelineRun.objects.get(pk=five.pk).curve_changes == 2


def test_a_loss_going_nan_asks_the_rules_once_whatever_the_series(user, roots, rules):
    one, many = _run(user, roots, "one").training_run.pk, _run(user, roots, "ten").training_run.pk
    keys = [f"loss_{i}" for i in range(10)]
    metrics_record(training_run_id=one, points=_batch(keys[:1], [1]))
    metrics_record(training_run_id=many, points=_batch(keys, [1]))
    went = (_queries(training_run_id=one, points=_batch(keys[:1], [2], nan_in=keys)),
            _queries(training_run_id=many, points=_batch(keys, [2], nan_in=keys)))
    assert len(went[0]) == len(went[1]) > BATCH_QUERIES
    assert Alert.objects.filter(event="loss_nan").count() == 3 * 2  # once per rule and run
    alert = Alert.objects.filter(run__training_run__pk=one).first()
    assert alert.text.startswith(f"run {alert.run_id} “one”: train loss_0 is nan at step 2")
    # A loss still NaN in the next batches is already known: no rule is asked again.
    still = _queries(training_run_id=many, points=_batch(keys, [3], nan_in=keys))
    assert len(still) == BATCH_QUERIES, still


def _series(training_run_id, count, points):
    keys = [f"loss_{i}" for i in range(count)]
    for lo in range(1, points + 1, 1000):
        metrics_record(training_run_id=training_run_id, points=_batch(keys, range(lo, min(points + 1, lo + 1000))))


def _get_count(client, url) -> int:
    cache.clear()  # built, not read from the answer every viewer shares
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, response.content[:300]
    return len(ctx)


def test_a_curve_read_and_a_status_poll_cost_the_same_queries_for_1_series_and_20(client, user, roots):
    client.force_login(user)
    one, many = _run(user, roots, "one"), _run(user, roots, "twenty")
    _series(one.training_run.pk, 1, 3 * CHUNK_POINTS)
    _series(many.training_run.pk, 20, 3 * CHUNK_POINTS)
    assert MetricChunk.objects.filter(series__training_run=many.training_run).count() == 20 * 3
    for path in ("metrics/?points=2000", "metrics/?points=500&start=100&end=9000", "status/"):
        few = _get_count(client, f"/api/v1/runs/{one.pk}/{path}")
        more = _get_count(client, f"/api/v1/runs/{many.pk}/{path}")
        assert few == more, path
    body = client.get(f"/api/v1/runs/{many.pk}/metrics/?points=2000").json()
    assert len(body["series"]) == 20 and {len(s["steps"]) for s in body["series"]} == {2000}


def _report_queries(training_run_id: int, points: list[dict]) -> list[str]:
    """A checked batch reported as the API stores it (runs.pipeline.launch.external holds the transaction)."""
    with CaptureQueriesContext(connection) as ctx, transaction.atomic():
        counts = points_report(training_run_id=training_run_id, points=points)
    assert counts.accepted == len(points), counts
    return [q["sql"] for q in ctx.captured_queries]


def test_the_apis_appended_points_cost_the_workers_queries_and_merge_from_memory(user):
    """The API's points after a series' last step go through the workers' append (services.points_append): the
    same statements a batch, and a batch that fills chunks merges the open points this process wrote without
    reading them back (the old append read them back and inserted by COPY)."""
    five = external_run_create(user=user, name="five", config={"epochs": 1}).training_run.pk
    keys = [f"loss_{i}" for i in range(5)]
    _report_queries(five, _batch(keys, [1, 2]))  # the series' rows made
    steady = _report_queries(five, _batch(keys, range(3, 203)))
    # BEGIN, the series locked, the chunks inserted and the summaries updated in one statement, COMMIT, then the
    # counters' bump (after the caller's commit: it updates the training's progress after the points). No savepoint
    # of its own.
    assert [q.split()[0] for q in steady] == ["BEGIN", "SELECT", "WITH", "COMMIT", "SET"], steady
    assert "INSERT INTO" in steady[2] and "UPDATE" in steady[2]
    merged = _report_queries(five, _batch(keys, range(203, 203 + CHUNK_POINTS)))
    assert len(merged) == len(steady) and "DELETE" in merged[2], merged  # the open chunks' delete, nothing read back
    for series in MetricSeries.objects.filter(training_run_id=five):
        assert (series.num_points, series.open_points, series.open_chunks) == (202 + CHUNK_POINTS, 202, 1)
        assert series_points(series=series).steps.tolist() == list(range(1, 203 + CHUNK_POINTS))


def _prepared_on_this_connection() -> set[str]:
    """The first word of each statement on the metric tables that PostgreSQL holds prepared for this connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return {row[0].split()[0] for row in cursor.fetchall()
                if MetricSeries._meta.db_table in row[0] or MetricChunk._meta.db_table in row[0]}


def test_a_batchs_statements_are_prepared_on_postgresql_unless_the_setting_says_not(settings, user, roots):
    """Planned once a worker's connection, not every batch (the lock; the chunks' insert and the summaries' update,
    with a merge's delete or without); DATABASE_PREPARED_STATEMENTS=0 prepares none. The curve reads back alike either way."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    training = _run(user, roots, "prepared").training_run.pk
    keys = ["loss", "acc_0"]
    settings.DATABASE_PREPARED_STATEMENTS = False
    connection.close()  # a connection of its own: nothing prepared on it yet
    metrics_record(training_run_id=training, points=_batch(keys, range(1, 101)))
    metrics_record(training_run_id=training, points=_batch(keys, range(101, 101 + CHUNK_POINTS)))  # a merge
    assert _prepared_on_this_connection() == set()
    settings.DATABASE_PREPARED_STATEMENTS = True
    connection.close()
    metrics_record(training_run_id=training, points=_batch(keys, range(101 + CHUNK_POINTS, 201 + CHUNK_POINTS)))
    metrics_record(training_run_id=training, points=_batch(keys, range(201 + CHUNK_POINTS, 201 + 2 * CHUNK_POINTS)))
    assert _prepared_on_this_connection() == {"SELECT", "WITH"}
    last = 200 + 2 * CHUNK_POINTS
    for series in MetricSeries.objects.filter(training_run_id=training):
        points = series_points(series=series)
        assert points.steps.tolist() == list(range(1, last + 1))
        assert points.values.tolist() == [1.0 / s for s in range(1, last + 1)]
        assert (series.num_points, series.last_step) == (last, last)


def test_a_batch_past_postgresqls_parameter_limit_is_stored_whole(user, roots):
    """3,000 series in one batch need more than the 65,535 parameters one statement may carry: the writes go in as
    many statements as the limit asks, twice (the series made, then steady), and every point reads back."""
    training = _run(user, roots, "wide").training_run.pk
    keys = [f"probe/layer_{i}" for i in range(3000)]
    for steps in ([1], [2, 3]):
        assert metrics_record(training_run_id=training, points=_batch(keys, steps)) == len(keys) * len(steps)
    assert MetricSeries.objects.filter(training_run_id=training).count() == 3000
    assert set(MetricSeries.objects.filter(training_run_id=training).values_list("num_points", "last_step",
                                                                                  "open_chunks")) == {(3, 3, 2)}
    for series in MetricSeries.objects.filter(training_run_id=training, key__in=keys[::997]):
        assert series_points(series=series).values.tolist() == [1.0, 0.5, 1.0 / 3]
    assert PipelineRun.objects.get(training_run__pk=training).curve_changes == 2
