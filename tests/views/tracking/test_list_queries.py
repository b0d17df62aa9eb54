"""The list pages and the run page ask the database a fixed number of questions, whatever the number
of rows: 3 runs and 30 runs cost the same queries (issue 8, "no query per row"); and once built, what
every viewer shares is read from the cache (runs.live): the runs list then costs 3 queries and the
run page 9, the session's and the user's included (issue 19), with the viewer's projects (the run page:
whether they see the run), the runs list the viewer's saved views too (issue 28), and the unread alerts
(the runs list: these and its version in one statement, issue 40)."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.pipeline import services
from runs.models import Checkpoint, Evaluation, Review, StageStatus, Verification
from runs.review.reviews import review_add, review_state, review_states
from runs.pipeline.launch.run_config import RunConfig
from tests.helpers.artifacts import extraction_written

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer():
    account = get_user_model().objects.create_user("rita", password="pw-rita-1")
    account.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    return account


def add_runs(count, *, roots, user, reviewer):
    """Runs as a team leaves them: reviewed (a comment, then a decision), extraction verified, one checkpoint."""
    for i in range(count):
        run = services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                  config=RunConfig(), enqueue=False)
        review_add(user=user, subject=run, decision="comment", text=f"looks fine {i}")
        review_add(user=reviewer, subject=run, decision=("approve", "request_changes")[i % 2], text=f"verdict {i}")
        extraction = extraction_written(run, path=f"{run.output_dir}/extraction")
        review_add(user=reviewer, subject=extraction, decision="approve", text="shapes match")
        Verification.objects.create(extraction=extraction, passed=i % 3 != 0, layout="flat_v1", seconds=0.1)
        Checkpoint.objects.create(training_run=run.training_run, epoch=0, path=f"{run.output_dir}/checkpoints/0")


# Built from nothing: session, user, then each page's own (the runs list: its counters, the page of ids
# with their count, the rows with their stages and tags in one query, review states, then the filter
# menus in one query; the runs list reads the viewer's projects and saved views, their unread alerts and its
# version in one statement, runs.saved_views.viewer_reads). 21 before issue 40's rows as values, 15 before
# the filter menus were one query and the tags came in the rows' query, 11 before the viewer's one statement.
LIST_QUERIES = {"/": 8, "/extractions/": 5}


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return len(ctx)


@pytest.mark.parametrize("url", ["/", "/extractions/"])
def test_a_list_page_costs_the_same_queries_for_3_rows_and_30(client, user, reviewer, roots, url,
                                                            django_assert_max_num_queries):
    client.force_login(user)
    add_runs(3, roots=roots, user=user, reviewer=reviewer)
    few = count_queries(client, url)
    assert few == LIST_QUERIES[url]
    add_runs(27, roots=roots, user=user, reviewer=reviewer)
    cache.clear()  # built again, not read from the cache: the count of a page built for 30 rows
    with django_assert_max_num_queries(few):
        page = client.get(url).content.decode()
    # All 30 rows are on the page, each with its own decision.
    assert page.count("by rita") == 30
    changes = Review.objects.filter(decision="request_changes").count() if url == "/" else 0
    assert changes and page.count(">request changes<") == changes if url == "/" else changes == 0


def test_the_run_page_and_its_status_cost_the_same_queries_for_1_checkpoint_and_10(
        client, user, reviewer, roots, django_assert_max_num_queries):
    client.force_login(user)
    add_runs(1, roots=roots, user=user, reviewer=reviewer)
    run = user.pipeline_runs.get()
    urls = [run.get_absolute_url(), f"/api/v1/runs/{run.pk}/status/", f"/api/v1/runs/{run.pk}/metrics/"]
    few = {url: count_queries(client, url) for url in urls}
    # The page's 24 and the whole summary's 12, each plus its stages' shards and its training's nodes (issue 36):
    # one query each, whatever their number. The page reads its checkpoints, their measurements, serve checks
    # and the attempts once for its body and its summary (issue 40: 26 before, when each read them).
    assert few[run.get_absolute_url()] <= 21 and few[f"/api/v1/runs/{run.pk}/status/"] <= 14
    for epoch in range(1, 10):
        checkpoint = Checkpoint.objects.create(training_run=run.training_run, epoch=epoch, path=f"/x/{epoch}")
        Evaluation.objects.create(checkpoint=checkpoint, status=StageStatus.SUCCEEDED, tau=1.5 + epoch / 10)
        review_add(user=reviewer, subject=run, decision="comment", text=f"epoch {epoch} looks better")
    cache.clear()  # built again for 10 checkpoints (these rows were written without committing, so no counter moved)
    for url in urls:
        with django_assert_max_num_queries(few[url]):
            assert client.get(url).status_code == 200
    page = client.get(run.get_absolute_url()).content.decode()
    assert page.count('class="review comment"') == 10 and page.count("details, review, measure") == 10


def test_a_page_every_viewer_shares_is_read_from_the_cache_in_3_or_9_queries(
        client, user, reviewer, roots, django_assert_num_queries):
    client.force_login(user)
    add_runs(5, roots=roots, user=user, reviewer=reviewer)
    run = user.pipeline_runs.first()
    # The runs list: session, user, then its viewer's reads and its version in one statement (6 before).
    for url, queries in (("/", 3), (run.get_absolute_url(), 9), (f"/api/v1/runs/{run.pk}/status/", 3)):
        built = client.get(url).content
        with django_assert_num_queries(queries):  # session, user, counters (+ reviews, tags and the fleet's)
            again = client.get(url).content
        assert again.count(b'data-run="') == built.count(b'data-run="') and len(again) > 1000
    # A review is not counted on the run (runs.pipeline.status.changes) but is read on each request.
    review_add(user=reviewer, subject=run, decision="comment", text="a fresh look")
    assert "a fresh look" in client.get(run.get_absolute_url()).content.decode()


def test_review_states_is_the_latest_decision_of_each_subject_and_ignores_comments(user, reviewer, roots):
    add_runs(2, roots=roots, user=user, reviewer=reviewer)
    first, second = user.pipeline_runs.order_by("id")
    review_add(user=reviewer, subject=first, decision="request_changes", text="newer verdict")
    review_add(user=user, subject=first, decision="comment", text="a comment after it")
    states = review_states(subjects=[first, second])
    assert (states[first.pk].text, states[second.pk].text) == ("newer verdict", "verdict 1")
    assert review_state(first) == states[first.pk]
    assert review_states(subjects=[]) == {}
    assert Review.objects.filter(run=first).count() == 4


@pytest.mark.django_db
def test_the_datasets_list_shows_pages_of_100(client, user):
    from runs.models import Dataset

    Dataset.objects.bulk_create([Dataset(name=f"d{i:03d}.jsonl", path=f"/data/d{i:03d}.jsonl") for i in range(230)])
    client.force_login(user)
    first = client.get("/datasets/").content.decode()
    assert first.count('href="/datasets/') == 1 + 100 and "page 1 of 3 (230 datasets)" in first
    last = client.get("/datasets/?page=3").content.decode()
    assert last.count('href="/datasets/') == 1 + 30  # the nav's link, then the rows
    assert client.get("/datasets/?page=x").status_code == 200  # a bad page number shows the first page


@pytest.mark.django_db(transaction=True)
def test_a_runs_list_built_afresh_runs_its_statements_prepared_unless_the_setting_says_not(client, user, roots,
                                                                                             settings):
    """The session's read, the page's ids, its rows and the filter menus are planned once a connection (PostgreSQL
    planned the menus in 2 to 3 ms against 1 to run them, issue 40); DATABASE_PREPARED_STATEMENTS=0 prepares none.
    The same page either way."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    client.force_login(user)
    for i in range(3):
        services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                            config=RunConfig(), name=f"prepared {i}", enqueue=False)

    def page_and_prepared() -> tuple[str, set[str]]:
        connection.close()  # a connection of its own: nothing prepared on it yet
        cache.clear()
        page = client.get("/?sort=name").content.decode()
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            found = [row[0] for row in cursor.fetchall()]
        kinds = {"ids": any('COUNT("runs_pipelinerun"."id") OVER ()' in s for s in found),
                 "rows": any('"runs_pipelinerun"."name" AS "name"' in s for s in found),
                 "menus": any(s.startswith('SELECT ARRAY(SELECT DISTINCT "runs_targetmodel"."name"') for s in found),
                 "session": any('FROM "django_session"' in s for s in found)}
        return page, {kind for kind, there in kinds.items() if there}

    settings.DATABASE_PREPARED_STATEMENTS = False
    unprepared, none = page_and_prepared()
    settings.DATABASE_PREPARED_STATEMENTS = True
    prepared, kinds = page_and_prepared()
    assert none == set() and kinds == {"ids", "rows", "menus", "session"}
    assert [f"prepared {i}" in prepared for i in range(3)] == [True] * 3
    def strip(page: str) -> str:  # the form's token, and "now" become "a second ago" between the two
        page = re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", page)
        return re.sub(r'(<td title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d">)[^<]*</td>', r"\1</td>", page)
    assert strip(prepared) == strip(unprepared)
    # A search's statements name what its words matched, so they are run once, not kept prepared.
    assert "prepared 1" in client.get("/?q=prepared").content.decode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%websearch_to_tsquery%%'")
        assert cursor.fetchone()[0] == 0
