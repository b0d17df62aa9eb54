"""The runs list as a tracker: search, filters, sort, pages, tags, compare boxes, launch a copy."""
import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from runs.pipeline import services
from runs.models import Checkpoint, RunTag, StageStatus
from runs.pipeline.launch.run_config import RunConfig
from runs.tracking.runs_list.run_table import PAGE_SIZE
from runs.review.tags import run_tags_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def roots(tmp_path, settings):
    data = tmp_path / "data"
    data.mkdir()
    settings.EAGLE3WEB_DATA_ROOTS = [data.resolve()]
    settings.EAGLE3WEB_RUNS_DIR = data.resolve() / "runs"
    for name in ("llama-a", "qwen-b"):
        (data / name).mkdir()
        (data / name / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8,
            "hidden_size": 64, "vocab_size": 5000}))
    (data / "chats.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "héllo ✓"}]}\n')
    return data


def launch(roots, user, *, target="llama-a", name="", lr=3e-4):
    return services.run_launch(user=user, target_path=roots / target, dataset_path=roots / "chats.jsonl",
                               config=RunConfig(lr=lr), name=name, enqueue=False)


def names(response):
    return [row.split('aria-label="compare ')[1].split('"')[0]
            for row in response.content.decode().split('<tr data-run=')[1:]]


def test_search_filters_and_sort(client, user, roots):
    a = launch(roots, user, name="baseline llama")
    b = launch(roots, user, target="qwen-b", name="qwen try")
    c = launch(roots, user, name="failed one")
    c.preparation.status = StageStatus.FAILED
    c.preparation.save()
    Checkpoint.objects.create(training_run=a.training_run, epoch=0, path="/x/0", val_loss=2.5)
    Checkpoint.objects.create(training_run=a.training_run, epoch=1, path="/x/1", val_loss=1.5)
    Checkpoint.objects.create(training_run=b.training_run, epoch=0, path="/y/0", val_loss=1.9)
    client.force_login(user)
    assert names(client.get("/", {"q": "qwen"})) == ["qwen try"]
    assert names(client.get("/", {"target": "llama-a"})) == ["failed one", "baseline llama"]
    assert names(client.get("/", {"status": "failed"})) == ["failed one"]
    assert names(client.get("/", {"q": str(b.pk)})) == ["qwen try"]
    assert names(client.get("/", {"sort": "best_val_loss"})) == ["baseline llama", "qwen try", "failed one"]
    assert names(client.get("/", {"sort": "-best_val_loss"}))[:2] == ["qwen try", "baseline llama"]
    assert names(client.get("/", {"sort": "name"})) == ["baseline llama", "failed one", "qwen try"]
    page = client.get("/").content.decode()
    assert "1.5000" in page and "launch a copy" in page and 'name="ids"' in page
    assert page.count('href="/runs/new/?copy=') == page.count('<tr data-run="')  # each row's link, whole


def test_tags_are_set_shown_and_filtered(client, user, roots):
    a, b = launch(roots, user, name="one"), launch(roots, user, name="two")
    run_tags_set(run=a, text="baseline, fp8 ✓ ,baseline", user=user)
    run_tags_set(run=b, text="fp8 ✓", user=user)
    assert sorted(a.tags.values_list("name", flat=True)) == ["baseline", "fp8 ✓"]
    client.force_login(user)
    assert names(client.get("/", {"tag": "baseline"})) == ["one"]
    assert names(client.get("/", {"tag": "fp8 ✓"})) == ["two", "one"]
    response = client.post(f"/runs/{a.pk}/tags/", {"tags": "x" * 41})
    assert response.status_code == 302 and sorted(a.tags.values_list("name", flat=True)) == ["baseline", "fp8 ✓"]
    client.post(f"/runs/{a.pk}/tags/", {"tags": ""})
    assert not a.tags.exists() and list(RunTag.objects.values_list("name", flat=True)) == ["fp8 ✓"]


def test_a_viewer_cannot_tag(client, roots, user):
    run = launch(roots, user)
    viewer = get_user_model().objects.create_user("vic", password="pw-vic-1")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client.force_login(viewer)
    assert client.post(f"/runs/{run.pk}/tags/", {"tags": "mine"}).status_code == 403
    assert not run.tags.exists()


def test_pages_of_fifty(client, user, roots):
    for i in range(PAGE_SIZE + 3):
        launch(roots, user, name=f"run {i:03d}")
    client.force_login(user)
    first = client.get("/", {"sort": "name"})
    assert len(names(first)) == PAGE_SIZE and "page 1 of 2" in first.content.decode()
    assert names(client.get("/", {"sort": "name", "page": "2"})) == [f"run {i:03d}" for i in range(PAGE_SIZE, PAGE_SIZE + 3)]
    # A page past the last (a bookmark after runs were archived) shows the last; the count stays the total.
    past = client.get("/", {"sort": "name", "page": "9"})
    assert names(past) == [f"run {i:03d}" for i in range(PAGE_SIZE, PAGE_SIZE + 3)]
    assert "53 runs, page 2 of 2" in past.content.decode()
    # A filter none matches: page 1 of nothing, said so.
    assert "No run matches these filters" in client.get("/", {"q": "no such run", "page": "3"}).content.decode()


@pytest.mark.parametrize("params, message", [
    ({"sort": "password"}, "sort by &#x27;password&#x27; is not offered"),
    ({"status": "exploded"}, "status &#x27;exploded&#x27; is not a run status"),
    ({"page": "0"}, "page must be a number from 1"), ({"q": "x" * 201}, "q is 201 characters long"),
])
def test_bad_list_parameters_are_named(client, user, params, message):
    client.force_login(user)
    response = client.get("/", params, follow=True)
    assert message in response.content.decode()


def test_launch_a_copy_prefills_every_setting(client, user, roots):
    run = launch(roots, user, name="tuned", lr=1.5e-4)
    client.force_login(user)
    form = client.get("/runs/new/", {"copy": run.pk}).context["form"]
    assert form.initial["lr"] == 1.5e-4 and form.initial["name"] == "copy of tuned"
    assert form.initial["target_path"] == str((roots / "llama-a").resolve())
    assert form.initial["layer_ids"] == ", ".join(str(i) for i in run.config["layer_ids"])
    assert client.get("/runs/new/", {"copy": "999999"}, follow=True).redirect_chain[-1][0] == "/runs/new/"


def test_run_page_lists_every_setting(client, user, roots):
    run = launch(roots, user, lr=2e-4)
    client.force_login(user)
    settings = dict(client.get(run.get_absolute_url()).context["settings"])
    assert settings["lr"] == 2e-4 and settings["target"] == "llama-a"
    assert set(RunConfig().as_dict()) <= set(settings)
    page = client.get(run.get_absolute_url()).content.decode()
    assert run.created_at.strftime("%Y-%m-%d") in page  # absolute beside relative ("x minutes ago")


def test_the_lists_sql_status_agrees_with_run_status_for_every_mix_of_stage_statuses(user, roots):
    """The status a list filters and sorts by (SQL) is the one each row shows (runs.pipeline.status.run_status),
    for every set of statuses a run's stages can hold (the rules look at which are present)."""
    from itertools import combinations

    from runs.models import PipelineRun
    from runs.pipeline.lifecycle.stages import STAGES
    from runs.tracking.runs_list.run_table import with_columns
    from runs.pipeline.selectors import run_rows
    from runs.pipeline.status.run_status import run_status

    run = launch(roots, user)
    statuses = list(StageStatus)
    seen = set()
    for size in range(1, len(STAGES) + 1):
        for present in combinations(statuses, size):
            for i, stage in enumerate(STAGES):
                stage.model.objects.filter(run=run).update(status=present[i % size])
            in_sql = with_columns(PipelineRun.objects.filter(pk=run.pk)).values_list("status", flat=True).get()
            in_python = run_status(run_rows().get(pk=run.pk))
            assert in_sql == in_python, (present, in_sql, in_python)
            seen.add(in_python)
    assert seen == set(statuses)


def test_the_newest_first_fast_path_gives_the_general_querys_pages_and_counts(user, roots, monkeypatch):
    """The default page and a project filter take the index path (run_table._page_ids, newest=True); every page of
    it, and its count, must be what the one windowed query answers on the same filters, and what the runs are
    (newest first, ties by id), with runs of a project the viewer cannot see in neither."""
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import PipelineRun, Project
    from runs.tracking.runs_list import run_filters, run_table as table

    a, b = Project.objects.create(name="pa"), Project.objects.create(name="pb")
    now = timezone.now()
    runs = [launch(roots, user, name=f"r{i}") for i in range(9)]
    for i, run in enumerate(runs):  # two runs share each instant but the last: the id breaks the tie
        PipelineRun.objects.filter(pk=run.pk).update(project=a if i % 3 else b, archived=i in (2, 5),
                                                      created_at=now - timedelta(minutes=i // 2))
    rows = PipelineRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", "project_id", "archived", "created_at")
    monkeypatch.setattr(table, "PAGE_SIZE", 3)
    table._page_statements.clear()  # another test's, of the same filters, would be reused
    made = []
    real = table._page_statements_of

    def both(ordered, *, newest):
        fast = real(ordered, newest=newest)
        made.append((fast, table.PageStatements.of(ordered, counted=True)))
        return fast

    monkeypatch.setattr(table, "_page_statements_of", both)
    for visible in (None, [a.pk]):
        for project in ("", "pa", "pb"):
            for archived in ("", "only", "with"):
                expected = sorted(((created, pk) for pk, proj, arch, created in rows
                                   if (visible is None or proj in visible) and (not project or proj == (a if project == "pa" else b).pk)
                                   and (archived == "with" or arch == (archived == "only"))), reverse=True)
                expected = [pk for _, pk in expected]
                for number in (1, 2, 3, 9):
                    page, count = table.run_table(filters=run_filters.RunFilters(project=project, archived=archived, page=number),
                                                  visible=visible)
                    # Compiled once for the filters, whatever the page: the index path, not the window.
                    (fast, general), = made
                    assert not fast.counted and general.counted
                    # a page past the last asks again for the last: both ways must agree
                    assert table._page_ids(fast, number) == table._page_ids(general, number), \
                        (visible, project, archived, number)
                    last = max(1, -(-len(expected) // 3))
                    shown = min(number, last)
                    assert count == len(expected) and [r.pk for r in page.object_list] == expected[(shown - 1) * 3:shown * 3]
                made.clear()
    assert not table.run_table(filters=run_filters.RunFilters(project="pb"), visible=[a.pk])[1]  # b's runs hidden


def test_the_cells_decimals_are_the_floatformat_filters():
    """τ and the best loss are written as the template's `floatformat` wrote them (runs.saved_views.table_rows._fixed):
    halves rounded up from the float's shortest decimal, no "-0.00", the filter's own answer past 999 (a thousands
    separator) and for the tiniest floats."""
    import random
    import struct

    from django.template.defaultfilters import floatformat

    from runs.saved_views.table_rows import _fixed

    rnd = random.Random(40)
    values = [0.0, -0.0, 0.005, -0.005, 0.015, 2.675, 1.005, -1.005, 0.00005, -0.00005, 998.995, 998.9999, 999.0,
              -999.0, 1234.5678, 1e-6, -1e-6, 1.1e-6, 9e-7, 1e-20, float("nan"), float("inf"), None, 3, 2.5]
    values += [(rnd.randrange(-10**6, 10**6) + 0.5) / 10 ** rnd.choice([2, 3, 4]) for _ in range(3000)]
    values += [rnd.uniform(-1, 1) * 10 ** rnd.randint(-9, 4) for _ in range(3000)]
    values += [struct.unpack("d", struct.pack("Q", rnd.getrandbits(64)))[0] for _ in range(1000)]
    for value in values:
        for places in (2, 4):
            assert _fixed(value, places) == str(floatformat(value, places)), (value, places)


def test_the_cells_times_are_the_date_filters_in_the_viewers_time_zone():
    """The "created" cell's title and a running run's start are written as the template's `date` filter wrote them
    ("Y-m-d H:i:s" and "c") in the time zone active for the request (the zone looked up once a table: table_rows._local),
    across a daylight-saving change and a zone off the hour."""
    import zoneinfo
    from datetime import datetime, timedelta, timezone as fixed

    from django.template import Context, Template
    from django.utils import timezone

    from runs.saved_views.table_rows import _iso, _seconds

    template = Template('{{ at|date:"Y-m-d H:i:s" }}|{{ at|date:"c" }}')
    start = datetime(2026, 3, 7, 23, 59, 59, 999_999, tzinfo=fixed.utc)
    times = [start + timedelta(minutes=37 * i, microseconds=i) for i in range(1500)]
    for name in ("UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"):
        with timezone.override(zoneinfo.ZoneInfo(name)):
            zone = timezone.get_current_timezone()
            for at in times:
                assert f"{_seconds(at, zone)}|{_iso(at, zone)}" == template.render(Context({"at": at})), (name, at)
    assert _iso(None, zone) == ""


def test_a_filter_sets_statements_are_compiled_once_and_answer_for_the_runs_that_come_later(user, roots, monkeypatch):
    """The page's statements are kept per filter set (runs.tracking.runs_list.run_table._statements): a second
    request, another page or a new run reuse them and still see every run that matches now. A search reads what
    its words match first (a tag put on since), so it is built every time."""
    from runs.tracking.runs_list import run_filters, run_table as table

    table._page_statements.clear()
    built = []
    real = table._page_statements_of
    monkeypatch.setattr(table, "_page_statements_of", lambda ordered, *, newest: built.append(1) or real(ordered, newest=newest))
    fast = launch(roots, user, name="fast", lr=1e-3)
    launch(roots, user, name="slow")
    view = run_filters.RunFilters(settings=(("lr", 1e-3),), sort="name", descending=False)
    page, count = table.run_table(filters=view)
    assert ([r.name for r in page.object_list], count, len(built)) == (["fast"], 1, 1)
    faster = launch(roots, user, name="faster", lr=1e-3)
    page, count = table.run_table(filters=run_filters.RunFilters(settings=(("lr", 1e-3),), sort="name",
                                                                 descending=False, page=2, columns=("name",)))
    assert ([r.name for r in page.object_list], count, len(built)) == (["fast", "faster"], 2, 1)  # page 2 of 1
    assert table.run_table(filters=view, visible=[])[1] == 0 and len(built) == 2  # other projects: their own
    searched = run_filters.RunFilters(q="zeta ✓")
    assert table.run_table(filters=searched)[1] == 0
    run_tags_set(run=faster, text="zeta ✓", user=user)
    page, count = table.run_table(filters=searched)
    assert ([r.pk for r in page.object_list], count, len(built)) == ([faster.pk], 1, 4)
    assert fast.pk not in [r.pk for r in page.object_list]
