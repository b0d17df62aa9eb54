"""Curating a dataset's samples in the admin: excluded samples are skipped by later preparations."""
import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from runs.pipeline import services
from runs.models import CurationAction, DatasetSample, Preparation
from runs.pipeline.launch.run_config import RunConfig
from workers.orchestration.tasks import stage_execute

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator(client):
    user = get_user_model().objects.create_superuser("curator", password="pw-curator-1")
    client.login(username="curator", password="pw-curator-1")
    return user


def registered_and_catalogued(path):
    """Register the dataset, then run the catalogue job it queued the way a worker does."""
    dataset = services.dataset_register(path=path)
    catalogue = dataset.catalogues.get(status="queued")
    assert stage_execute(stage_name="catalogue", record_id=catalogue.pk, worker="test")
    return dataset


def test_registering_a_dataset_catalogues_each_conversation(tiny_target):
    dataset = services.dataset_register(path=tiny_target.chats_path)
    assert dataset.samples.count() == 0  # the request only checked the head of the file; a worker reads it all
    dataset = registered_and_catalogued(tiny_target.chats_path)
    assert dataset.samples.count() == tiny_target.num_conversations
    catalogue = dataset.catalogues.get()
    assert (catalogue.status, catalogue.samples_added, catalogue.samples_total) == (
        "succeeded", tiny_target.num_conversations, tiny_target.num_conversations)
    assert catalogue.progress_done == catalogue.progress_total == 2 * dataset.size_bytes
    sample = dataset.samples.first()
    assert sample.num_turns >= 1 and sample.preview


def test_admin_exclude_action_logs_who_and_which(client, curator, tiny_target):
    dataset = registered_and_catalogued(tiny_target.chats_path)
    chosen = list(dataset.samples.order_by("line").values_list("pk", flat=True)[:3])
    response = client.post(reverse("admin:runs_datasetsample_changelist"),
                           {"action": "exclude_samples", "_selected_action": chosen}, follow=True)
    assert b"Excluded 3 sample(s)" in response.content
    assert DatasetSample.objects.filter(excluded=True).count() == 3
    log = CurationAction.objects.get()
    assert log.user == curator and log.action == "exclude" and len(log.sample_ids) == 3


def _listed(client, **params) -> set[str]:
    """The sample ids the admin's list shows for `params` (every page of it)."""
    url, shown, page, pages = reverse("admin:runs_datasetsample_changelist"), set(), 1, 1
    while page <= pages:
        response = client.get(url, {**params, "p": page})
        assert response.status_code == 200
        shown |= {sample.sample_id for sample in response.context["cl"].result_list}
        page, pages = page + 1, response.context["cl"].paginator.num_pages
    return shown


def test_admin_search_and_filters_list_what_a_scan_of_every_sample_finds(client, curator, tiny_target):
    dataset = registered_and_catalogued(tiny_target.chats_path)
    samples = list(dataset.samples.all())
    odd = samples[7]
    DatasetSample.objects.filter(pk=odd.pk).update(notes="Überprüfung nötig: 日本語 \u200b zero-width", tags="needs-review")
    samples = list(dataset.samples.all())

    def having(text):  # the oracle: the text in any searched column, case aside
        return {s.sample_id for s in samples
                if any(text.upper() in getattr(s, f).upper() for f in ("sample_id", "preview", "tags", "notes"))}

    for q in (samples[0].sample_id, samples[3].preview[5:25], "ÜBERPRÜFUNG", "日本語", "needs-review"):
        assert _listed(client, q=q) == having(q) != set(), q
    assert _listed(client, q="Überprüfung") == {odd.sample_id}
    replies = {"none": (0, 1), "one": (1, 2), "few": (2, 5), "many": (5, 10**6)}
    for value, (low, high) in replies.items():
        assert _listed(client, replies=value) == {s.sample_id for s in samples if low <= s.num_turns < high}, value
    assert sum(len(_listed(client, replies=value)) for value in replies) == len(samples)
    assert _listed(client, length="short", excluded__exact="0") == {
        s.sample_id for s in samples if s.num_chars < 200 and not s.excluded}


def _more_samples(cursor, dataset, count=20000):
    cursor.execute("INSERT INTO runs_datasetsample (dataset_id, sample_id, line, num_turns, num_chars, preview, "
                   "excluded, tags, notes, content_hash) SELECT %s, 'extra-' || g, 1000 + g, 1 + g %% 7, g %% 3000, "
                   "'question ' || md5(g::text), false, '', '', md5(g::text) FROM generate_series(1, %s) g",
                   [dataset.pk, count])
    cursor.execute("ANALYZE runs_datasetsample")


def test_a_deep_page_skips_the_rows_before_it_by_their_keys_alone(client, curator, tiny_target):
    """Page 10,000 of 2,000,000 samples took 0.64 s as an OFFSET over whole rows: the rows before a page are
    skipped in a query of their keys (the ordering's index alone), then the page's rows are read by key."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    dataset = registered_and_catalogued(tiny_target.chats_path)
    with connection.cursor() as cursor:
        _more_samples(cursor, dataset, count=2500)
    DatasetSample.objects.filter(sample_id="extra-1777").delete()
    ordered = list(DatasetSample.objects.order_by("dataset_id", "line", "id").values_list("sample_id", flat=True))
    url = reverse("admin:runs_datasetsample_changelist")
    for page in (1, 13, -(-len(ordered) // 100)):  # the first, one between, the last
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, {"p": page})
        assert [s.sample_id for s in response.context["cl"].result_list] == ordered[(page - 1) * 100:page * 100], page
        offset = [q["sql"] for q in queries.captured_queries
                  if 'FROM "runs_datasetsample"' in q["sql"] and "LIMIT" in q["sql"]]
        keys_only = 'SELECT "runs_datasetsample"."id" AS "pk"'
        assert offset and all(sql.split(" FROM ")[0] == keys_only for sql in offset), offset
    searched = client.get(url, {"q": "extra-17", "p": 2}).context["cl"]
    assert [s.sample_id for s in searched.result_list] == [i for i in ordered if "extra-17" in i][100:200]


def test_the_samples_list_reads_its_page_and_search_from_indexes(rf, curator, tiny_target):
    """At 2,000,000 samples, sorting every sample by its dataset's name took 0.97 s a page and the search
    read every row (4.4 s): with sequential scans priced out, both must come from migration 0038's indexes."""
    from django.contrib import admin
    from django.db import connection

    dataset = registered_and_catalogued(tiny_target.chats_path)
    model_admin = admin.site._registry[DatasetSample]
    plans = {}
    with connection.cursor() as cursor:
        # Enough samples, and fresh statistics, that the planner's choice is the one it makes at scale.
        _more_samples(cursor, dataset)
        cursor.execute("SET LOCAL enable_seqscan = off")
        for name, params in (("page", {}), ("search", {"q": "weather report"})):
            request = rf.get(reverse("admin:runs_datasetsample_changelist"), params)
            request.user = curator
            queryset = model_admin.get_changelist_instance(request).queryset
            # The page reads its first rows in order; the search, every match (its count).
            queryset = queryset[:100] if name == "page" else queryset.order_by().values("pk")
            sql, sql_params = queryset.query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, sql_params)
            plans[name] = "\n".join(row[0] for row in cursor.fetchall())
    assert "sample_dataset_line" in plans["page"] and "Sort" not in plans["page"], plans["page"]
    for column in ("sample_id", "preview", "tags", "notes"):
        assert f"sample_{column}_trigrams" in plans["search"], plans["search"]
    assert "Seq Scan on runs_datasetsample" not in plans["search"], plans["search"]


def test_a_preparation_skips_excluded_samples(tiny_target, curator, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_launch(user=curator, target_path=tiny_target.target_dir,
                                  dataset_path=tiny_target.chats_path, config=RunConfig(max_seq_len=256))
    assert stage_execute(stage_name="catalogue", record_id=run.dataset.catalogues.get().pk, worker="test")
    DatasetSample.objects.filter(pk__in=list(run.dataset.samples.values_list("pk", flat=True)[:10])).update(excluded=True)
    assert stage_execute(stage_name="prepare", record_id=run.preparation.pk, worker="test")
    preparation = Preparation.objects.get(run=run)
    assert preparation.num_conversations == tiny_target.num_conversations - 10
    assert preparation.num_excluded == 10


def test_dataset_page_counts_excluded_samples(client, curator, tiny_target):
    dataset = registered_and_catalogued(tiny_target.chats_path)
    dataset.samples.filter(pk__in=list(dataset.samples.values_list("pk", flat=True)[:4])).update(excluded=True)
    response = client.get(dataset.get_absolute_url())
    assert f"{tiny_target.num_conversations} conversations, 4 excluded".encode() in response.content
