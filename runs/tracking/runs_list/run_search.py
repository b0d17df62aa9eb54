"""The runs list's search box and setting filters (runs.tracking.runs_list.run_table): each a slow definition that says
what it finds and the form PostgreSQL serves from indexes at 100,000 runs (migration 0033, issue 40)."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q, QuerySet

from runs.data.models import Dataset, TargetModel
from runs.pipeline.models import PipelineRun


def search_vector():
    """What full-text search matches on PostgreSQL: the run's name and notes, by word, in no language's
    stemming (names are identifiers). The migration's GIN index (run_search) is built on this expression."""
    from django.contrib.postgres.search import SearchVector

    return SearchVector("name", "notes", config="simple")


MAX_TAGGED_IDS = 5000  # a tag's runs as a list in the query up to this many; past it, as a subquery


def search_match(q: str) -> Q:
    """The search box's match, as the slow definition: a run's name or notes (PostgreSQL's full-text search
    over run_search, or the text anywhere on SQLite), its target's, dataset's or owner's name, an exact tag
    or its id. Subqueries joined by OR: PostgreSQL reads every run's row for it (420 ms at 100,000 runs).
    On PostgreSQL, filter a queryset that aliases `words` to search_vector(), as `searched` does."""
    words = Q(words=_words(q)) if connection.vendor == "postgresql" else Q(notes__icontains=q)
    match = (Q(name__icontains=q) | words
             | Q(target_id__in=TargetModel.objects.filter(name__icontains=q).values("pk"))
             | Q(dataset_id__in=Dataset.objects.filter(name__icontains=q).values("pk"))
             | Q(owner_id__in=get_user_model().objects.filter(username__icontains=q).values("pk"))
             | Q(pk__in=tagged_run_ids(name__iexact=q)))
    return match | Q(pk=int(q)) if q.isdigit() and len(q) < 18 else match


def searched(runs: QuerySet[PipelineRun], q: str) -> QuerySet[PipelineRun]:
    """`runs` the search box finds for `q`. On PostgreSQL the few targets, datasets, owners and tagged runs
    that match come first, in one query, as lists: every part of the match is then a condition on the run's
    own columns that an index serves (the name's trigrams and run_config_gin of migration 0033, run_search,
    the foreign keys' indexes), and PostgreSQL ORs their bitmaps instead of reading every row. SQLite (the
    demo) filters by search_match itself."""
    if connection.vendor != "postgresql":
        return runs.filter(search_match(q))
    named = [TargetModel.objects.filter(name__icontains=q).values("pk"),
             Dataset.objects.filter(name__icontains=q).values("pk"),
             get_user_model().objects.filter(username__icontains=q).values("pk"),
             tagged_run_ids(name__iexact=q).order_by()[:MAX_TAGGED_IDS + 1]]
    parts, params = [], []
    for query in named:
        sql, found = query.query.sql_with_params()
        parts.append(f"ARRAY({sql})")
        params.extend(found)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        targets, datasets, owners, tagged = cursor.fetchone()
    match = Q(name__icontains=q) | Q(words=_words(q))
    for field, ids in (("target_id", targets), ("dataset_id", datasets), ("owner_id", owners)):
        if ids:
            match |= Q(**{f"{field}__in": ids})
    if len(tagged) > MAX_TAGGED_IDS:  # a tag on very many runs: their ids stay in the database
        match |= Q(pk__in=tagged_run_ids(name__iexact=q))
    elif tagged:
        match |= Q(pk__in=tagged)
    if q.isdigit() and len(q) < 18:
        match |= Q(pk=int(q))
    return runs.alias(words=search_vector()).filter(match)


def _words(q: str):
    from django.contrib.postgres.search import SearchQuery

    return SearchQuery(q, config="simple", search_type="websearch")


def setting_match(name: str, value) -> Q:
    """Runs launched with `name` = `value`: equal in the stored config, and on PostgreSQL besides contained
    in it (`config @> {name: value}`), the filter the GIN index run_config_gin serves (migration 0033);
    containment alone would take a list setting's longer lists too, equality keeps the exact ones."""
    equal = Q(**{f"config__{name}": value})
    return equal & Q(config__contains={name: value}) if connection.vendor == "postgresql" else equal



def tagged_run_ids(**tag_filter):
    """Ids of runs carrying a matching tag, as a subquery: joining the tags would repeat runs."""
    # Through the runs' side of the tags relation (runs.review.models.RunTag.runs): tracking stands below review.
    return PipelineRun.tags.through.objects.filter(**{f"runtag__{k}": v for k, v in tag_filter.items()}).values(
        "pipelinerun_id")
