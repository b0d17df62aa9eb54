"""The runs list's search and setting filters as PostgreSQL serves them at 100,000 runs (issue 40, migration
0033): each must find what its slow definition finds, and read indexes rather than every run's row."""
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from runs.models import PipelineRun, RunTag
from runs.tracking.runs_list import run_filters, run_search as search, run_table as table
from tests.views.tracking import test_run_table
from tests.views.tracking.test_run_table import launch

roots = test_run_table.roots  # the fixture

pytestmark = pytest.mark.django_db


def _slow(q):
    return set(PipelineRun.objects.alias(words=search.search_vector()).filter(search.search_match(q))
               .values_list("pk", flat=True))


def _fast(q):
    return set(search.searched(PipelineRun.objects.all(), q).values_list("pk", flat=True))


@pytest.fixture
def searchable(roots, user):
    other = get_user_model().objects.create_user("qwen-keeper", password="pw-search-1")
    runs = {name: launch(roots, owner, target=target, name=name)
            for name, owner, target in (("baseline llama", user, "llama-a"), ("qwen try", user, "llama-a"),
                                        ("plain", user, "qwen-b"),
                                        ("noted", user, "llama-a"), ("Paper-ish", user, "llama-a"))
            if owner is user}
    runs["kept"] = launch(roots, user, name="kept")
    PipelineRun.objects.filter(pk=runs["kept"].pk).update(owner=other)  # launched by a launcher, theirs now
    PipelineRun.objects.filter(pk=runs["noted"].pk).update(notes="warmup doubled, loss spikes near step 300")
    tag = RunTag.objects.create(name="paper")
    tag.runs.add(runs["plain"], runs["kept"])
    return runs


def test_search_finds_what_the_or_of_subqueries_finds(searchable, monkeypatch):
    runs = {name: run.pk for name, run in searchable.items()}
    # Known answers first: the name, the target (qwen-b), the owner (qwen-keeper); the notes' words; a tag.
    assert _fast("qwen") == {runs["qwen try"], runs["plain"], runs["kept"]}
    assert _fast("spikes") == {runs["noted"]}
    assert _fast("paper") == {runs["plain"], runs["kept"], runs["Paper-ish"]}
    assert _fast(str(runs["kept"])) >= {runs["kept"]}
    queries = ["qwen", "QWEN", "llama", "spikes", "spikes near", "paper", "Paper", "ke", "a", "%", "_", "zzz",
               "-spikes", str(runs["kept"]), "chats"]
    for q in queries:
        assert _fast(q) == _slow(q), q
    monkeypatch.setattr(search, "MAX_TAGGED_IDS", 1)  # a tag on more runs than the list takes: its subquery
    assert _fast("paper") == _slow("paper") == {runs["plain"], runs["kept"], runs["Paper-ish"]}


def test_setting_filters_find_the_runs_with_that_exact_setting(roots, user):
    from runs.pipeline.launch.run_config import RunConfig
    from runs.pipeline import services

    def run(name, **config):
        return services.run_launch(user=user, target_path=roots / "llama-a", dataset_path=roots / "chats.jsonl",
                                   config=RunConfig(**config), name=name, enqueue=False).pk

    small, large = run("small lr", lr=3e-4), run("large lr", lr=1e-3, epochs=3)
    # The launch adds the target's last layer (8): stored [2, 4, 6, 8] is inside [2, 4, 6, 7, 8], which
    # containment alone would take for the first.
    short, long = run("three layers", layer_ids=[2, 4, 6]), run("four layers", layer_ids=[2, 4, 6, 7])
    for settings, expected in (("lr=0.0003", {small, short, long}), ("lr=3e-4", {small, short, long}),
                               ("epochs=3", {large}), ("layer_ids=2,4,6,8", {short}),
                               ("layer_ids=2,4,6,7,8", {long}), ("layer_ids=2,4,6", set()), ("lr=0.001; epochs=3", {large})):
        filters = run_filters.RunFilters.from_query({"settings": settings})
        found = {r.pk for r in table.run_table(filters=filters)[0].object_list}
        slow = PipelineRun.objects.all()
        for name, value in filters.settings:
            slow = slow.filter(**{f"config__{name}": value})
        assert found == set(slow.values_list("pk", flat=True)) == expected, settings


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the indexes are PostgreSQL's")
def test_search_and_settings_read_the_indexes_not_every_row(searchable):
    """With sequential scans priced out, the old OR of subqueries still had to read every row (no index
    serves it); the search's and a setting's filters must come from migration 0033's indexes."""
    filters = run_filters.RunFilters.from_query({"q": "qwen", "settings": "epochs=2"})
    searched = search.searched(PipelineRun.objects.all(), "qwen")
    by_setting = PipelineRun.objects.filter(search.setting_match("epochs", 2))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plans = {}
        for name, query in (("search", searched), ("setting", by_setting)):
            sql, params = query.values("pk").query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, params)
            plans[name] = "\n".join(row[0] for row in cursor.fetchall())
    assert "run_name_trigrams" in plans["search"] and "run_search" in plans["search"], plans["search"]
    assert "Seq Scan on runs_pipelinerun" not in plans["search"], plans["search"]
    assert "run_config_gin" in plans["setting"], plans["setting"]
    assert filters.settings == (("epochs", 2),)
