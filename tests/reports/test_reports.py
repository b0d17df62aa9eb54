"""Reports through their pages and the API: Markdown cleaned of scripts and javascript: links, every save a
version that can be read again, editing kept to the author and staff, sign-in required, blocks that name
nothing drawable shown as errors naming it, tables with the runs' values, and the export's file."""
from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model

from runs.models import PipelineRun, Report, ReportVersion
from runs.pipeline import services as run_services
from runs.pipeline.launch.run_config import RunConfig
from runs.reports import services
from runs.tracking.services import metrics_record
from tests.helpers.fleet import cpu_worker

pytestmark = pytest.mark.django_db

HOSTILE = """# Findings

<script>alert(1)</script>
[click me](javascript:alert(2))
<a href="javascript:alert(3)" onclick="alert(4)">raw link</a>
<img src=x onerror=alert(5)>
<p style="color:red" onmouseover="alert(6)">styled</p>
[docs](https://example.org/docs)
[encoded](&#106;avascript:alert(8))
<iframe src="javascript:alert(9)"></iframe>
<svg><script>alert(10)</script></svg>
<form action="javascript:alert(11)"><button>go</button></form>
[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)
<details open ontoggle=alert(13)><summary>more</summary>hidden</details>
"""


@pytest.fixture
def other(django_user_model):
    account = django_user_model.objects.create_user("someone-else", password="pw-other-1")
    return account


def _run(user, roots, *, name: str, lr: float):
    cpu_worker(probe_queues=False)
    run = run_services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                                  config=RunConfig(draft_vocab_size=64, lr=lr), name=name, enqueue=False)
    metrics_record(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": f"loss_{k}", "step": step, "epoch": step / 10, "value": 5.0 - step / 10 - k}
        for step in range(1, 11) for k in range(2)])
    return run


def test_markdown_is_sanitised_scripts_handlers_styles_images_and_javascript_links_dropped(client, user):
    report = services.report_create(user=user, title="hostile", body=HOSTILE)
    client.force_login(user)
    html = client.get(f"/reports/{report.pk}/").content.decode()
    body = html.split('<article class="report-body" id="report-body">')[1].split("</article>")[0]
    assert "<h1>Findings</h1>" in body
    assert "<script" not in body and "javascript:" not in body
    assert re.search(r"\son\w+=", body) is None and "style=" not in body and "<img" not in body
    assert not re.search(r"<(iframe|svg|form|button)\b", body) and "data:" not in body
    # The links are kept as text; the safe one keeps its address, the javascript: ones lose theirs.
    assert '<a href="https://example.org/docs" rel="noopener noreferrer nofollow">docs</a>' in body
    assert "<a rel=\"noopener noreferrer nofollow\">click me</a>" in body
    assert "<a rel=\"noopener noreferrer nofollow\">encoded</a>" in body
    assert "<details><summary>more</summary>hidden</details>" in body
    assert "styled" in body


def test_every_save_is_a_version_and_each_version_reads_as_it_was_saved(client, user):
    client.force_login(user)
    response = client.post("/reports/new/", {"title": "Week 49", "body": "first draft", "save": "1"})
    report = Report.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/reports/{report.pk}/"
    for text in ("second draft", "third draft"):
        assert client.post(f"/reports/{report.pk}/edit/", {"title": "Week 49 final", "body": text}).status_code == 302
    assert list(ReportVersion.objects.filter(report=report).order_by("number").values_list("number", "body")) == [
        (1, "first draft"), (2, "second draft"), (3, "third draft")]
    report.refresh_from_db()
    assert (report.version_count, report.title) == (3, "Week 49 final")
    assert "first draft" in client.get(f"/reports/{report.pk}/versions/1/").content.decode()
    assert "third draft" in client.get(f"/reports/{report.pk}/").content.decode()
    versions = client.get(f"/reports/{report.pk}/versions/").content.decode()
    assert [int(n) for n in re.findall(r'data-version="(\d+)"', versions)] == [3, 2, 1]
    assert client.get(f"/reports/{report.pk}/versions/4/").status_code == 404


def test_preview_renders_the_body_and_stores_nothing(client, user):
    client.force_login(user)
    response = client.post("/reports/new/", {"title": "draft", "body": "**bold** words", "preview": "1"})
    assert response.status_code == 200
    assert "<strong>bold</strong> words" in response.content.decode()
    assert Report.objects.count() == 0


def test_a_report_without_a_title_is_refused_naming_the_field(client, user):
    client.force_login(user)
    response = client.post("/reports/new/", {"title": "", "body": "text", "save": "1"})
    assert response.status_code == 400
    assert 'id="title-error">This field is required.' in response.content.decode()
    assert Report.objects.count() == 0


def test_only_the_author_and_staff_edit_while_everyone_signed_in_reads(client, user, other):
    report = services.report_create(user=user, title="mine", body="v1")
    client.force_login(other)
    assert client.get(f"/reports/{report.pk}/").status_code == 200
    assert 'id="report-edit"' not in client.get(f"/reports/{report.pk}/").content.decode()
    assert client.get(f"/reports/{report.pk}/edit/").status_code == 403
    assert client.post(f"/reports/{report.pk}/edit/", {"title": "taken", "body": "v2"}).status_code == 403
    assert list(ReportVersion.objects.filter(report=report).values_list("body", flat=True)) == ["v1"]
    staff = get_user_model().objects.create_user("staff-member", is_staff=True)
    client.force_login(staff)
    assert client.post(f"/reports/{report.pk}/edit/", {"title": "mine", "body": "v2 by staff"}).status_code == 302
    assert ReportVersion.objects.get(report=report, number=2).saved_by == staff


@pytest.mark.parametrize("url", ["/reports/", "/reports/new/", "/reports/{pk}/", "/reports/{pk}/edit/",
                                 "/reports/{pk}/versions/", "/reports/{pk}/versions/1/", "/reports/{pk}/export/"])
def test_anonymous_visitors_are_sent_to_sign_in(client, user, url):
    report = services.report_create(user=user, title="private", body="secret")
    response = client.get(url.format(pk=report.pk))
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_blocks_that_name_nothing_drawable_are_error_blocks_naming_it(client, user, roots):
    run = _run(user, roots, name="base", lr=3e-4)
    body = "\n".join(["intro", "{{plot run=1}}", "{{chart run=999999999 metric=loss}}",
                      f"{{{{table runs={run.pk} columns=tau,colour}}}}", f"{{{{table runs={run.pk},888888888}}}}",
                      "{{generations checkpoint=777777777}}", f"{{{{chart run={run.pk} metric=loss bins=3}}}}",
                      "```", "{{not a block inside code}}", "```"])
    report = services.report_create(user=user, title="broken blocks", body=body)
    client.force_login(user)
    response = client.get(f"/reports/{report.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    errors = re.findall(r'role="alert" data-block="\d+"><strong>Block not shown:</strong> ([^<]*)<br>', html)
    assert errors == [
        "unknown directive &#x27;plot&#x27; (known: chart, table, generations)",
        "chart: no run 999999999",
        "table: unknown column &#x27;colour&#x27; (known: name, status, owner, created, tau, best_epoch, epochs, "
        "target, dataset, learning_rate, max_seq_len, max_samples, draft_vocab_size, ttt_steps, val_fraction, seed, "
        "layer_ids, max_tokens_per_step, extraction_backend, training_backend, best_by)",
        "table: no run 888888888",
        "generations: no checkpoint 777777777",
        "chart: unknown parameter &#x27;bins&#x27; (known: run, runs, metric, split)"]
    assert "6 blocks could not be shown" in html
    assert "<code>{{not a block inside code}}\n</code>" in html  # quoted in a fenced block: left as written


def test_a_table_block_shows_each_runs_values(client, user, roots):
    first, second = _run(user, roots, name="lr small", lr=1e-4), _run(user, roots, name="lr large", lr=5e-4)
    report = services.report_create(user=user, title="lr", body=f"{{{{table runs={first.pk},{second.pk} "
                                                                 "columns=name,learning_rate,ttt_steps,status}}")
    client.force_login(user)
    html = client.get(f"/reports/{report.pk}/").content.decode()
    rows = re.findall(r'<tr data-run="(\d+)">(.*?)</tr>', html)
    cells = [(int(pk), re.findall(r"<td>(?:<a [^>]*>)?([^<]*)", row)) for pk, row in rows]
    assert cells == [(first.pk, ["lr small", "0.0001", "3", "queued"]), (second.pk, ["lr large", "0.0005", "3", "queued"])]


def test_a_chart_block_names_its_runs_series_for_the_page_script(client, user, roots):
    run = _run(user, roots, name="curves", lr=3e-4)
    report = services.report_create(user=user, title="c", body=f"{{{{chart run={run.pk} metric=loss}}}}")
    client.force_login(user)
    html = client.get(f"/reports/{report.pk}/").content.decode()
    blocks = json.loads(html.split('<script id="report-blocks" type="application/json">')[1].split("</script>")[0])
    assert blocks == [{"index": 0, "kind": "chart", "source": f"{{{{chart run={run.pk} metric=loss}}}}", "metric": "loss",
                       "split": "", "lacking": [], "runs": [{
                           "id": run.pk, "name": "curves", "url": f"/runs/{run.pk}/", "colour": 0,
                           "metrics_url": f"/api/v1/runs/{run.pk}/metrics/", "series": ["train:loss_0", "train:loss_1"]}]}]


def test_the_export_is_one_file_with_the_tables_svg_charts_and_data(client, user, roots):
    run = _run(user, roots, name="exported run", lr=2e-4)
    report = services.report_create(user=user, title="to share", body=(
        f"Text **here**.\n\n{{{{table runs={run.pk} columns=name,learning_rate}}}}\n\n{{{{chart run={run.pk} metric=loss}}}}"))
    services.report_save(report=report, user=user, title="to share", body="newer")
    client.force_login(user)
    response = client.get(f"/reports/{report.pk}/export/?version=1")
    assert response["Content-Disposition"] == f'attachment; filename="report-{report.pk}-v1.html"'
    html = response.content.decode()
    assert "<strong>here</strong>" in html and "<td>0.0002</td>" in html
    # Links lead back to the server from wherever the file is opened.
    assert f'<td><a href="http://testserver/runs/{run.pk}/">exported run</a></td>' in html
    assert html.count('<polyline class="series"') == 2
    assert "exported run: train loss_0" in html and "exported run: train loss_1" in html
    # No script runs and nothing is fetched: the only <script> is the JSON data, no src= or <link>.
    assert re.findall(r"<script[^>]*>", html) == ['<script id="report-data" type="application/json">']
    assert " src=" not in html and "<link" not in html
    data = json.loads(html.split('<script id="report-data" type="application/json">')[1].split("</script>")[0])
    chart = data["blocks"][1]
    assert [p["key"] for p in chart["runs"][0]["points"]] == ["loss_0", "loss_1"]
    assert chart["runs"][0]["points"][0]["values"] == [5.0 - step / 10 for step in range(1, 11)]
    assert client.get(f"/reports/{report.pk}/export/?version=x").status_code == 400


def test_the_api_lists_writes_and_reads_reports(client, user, other):
    from runs.api import tokens

    secret = tokens.token_create(user=user, name="reports")[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    created = client.post("/api/v1/reports/", json.dumps({"title": "API report", "body": "# Hi\n{{nope}}"}),
                          content_type="application/json", **auth)
    assert created.status_code == 201
    answer = created.json()
    assert (answer["title"], answer["version"], answer["author"], answer["can_edit"]) == ("API report", 1, "launcher", True)
    assert answer["html"].startswith("<h1>Hi</h1>")
    assert answer["errors"] == ["unknown directive 'nope' (known: chart, table, generations)"]
    refused = client.post("/api/v1/reports/", json.dumps({"title": "x" * 201}), content_type="application/json", **auth)
    assert refused.status_code == 400 and "title" in refused.json()["fields"]
    assert Report.objects.count() == 1
    listed = client.get("/api/v1/reports/", **auth).json()
    assert [r["title"] for r in listed["results"]] == ["API report"]
    services.report_save(report=Report.objects.get(), user=user, title="API report", body="second")
    assert client.get(f"/api/v1/reports/{answer['id']}/?version=1", **auth).json()["body"] == "# Hi\n{{nope}}"
    assert client.get(f"/api/v1/reports/{answer['id']}/", **auth).json()["version"] == 2
    assert client.get(f"/api/v1/reports/{answer['id']}/?version=9", **auth).status_code == 404
    assert client.get("/api/v1/reports/").status_code == 401
    assert PipelineRun.objects.count() == 0


def test_the_openapi_document_describes_the_reports_endpoints(client, user):
    client.force_login(user)
    schema = client.get("/api/v1/openapi.json").json()
    assert set(schema["paths"]["/api/v1/reports/"]) == {"get", "post"}
    assert set(schema["paths"]["/api/v1/reports/{id}/"]) == {"get"}
    body = schema["components"]["schemas"]["ReportBody"]
    assert body["required"] == ["title"] and set(body["properties"]) == {"title", "body"}
    assert [p["name"] for p in schema["paths"]["/api/v1/reports/{id}/"]["get"]["parameters"] if p["in"] == "query"] == [
        "version"]


def test_a_chart_of_a_metric_no_run_records_says_it_does_not_exist_and_names_the_known_ones(client, user, roots):
    run = _run(user, roots, name="curves", lr=3e-4)
    body = "\n".join([f"{{{{chart run={run.pk} metric=los}}}}", f"{{{{chart run={run.pk} metric=tau_q}}}}",
                      f"{{{{chart run={run.pk} metric=loss split=val}}}}"])
    report = services.report_create(user=user, title="typo", body=body)
    client.force_login(user)
    html = client.get(f"/reports/{report.pk}/").content.decode()
    errors = re.findall(r'role="alert" data-block="\d+"><strong>Block not shown:</strong> ([^<]*)<br>', html)
    assert errors == [f"chart: metric=los does not exist in run {run.pk}; did you mean loss or loss_1 or loss_0? "
                      "Known: loss, loss_0, loss_1",
                      f"chart: metric=tau_q does not exist in run {run.pk}. Known: loss, loss_0, loss_1"]
    # The run records loss in train only: the val chart may still get points (a validation not yet run).
    blocks = json.loads(html.split('<script id="report-blocks" type="application/json">')[1].split("</script>")[0])
    assert [(b["kind"], b["split"]) for b in blocks if b["kind"] != "error"] == [("chart", "val")]


def test_a_table_counts_the_best_epoch_from_1_as_the_pages_do(client, user, roots):
    run = _run(user, roots, name="trained", lr=3e-4)
    type(run.training_run).objects.filter(pk=run.training_run.pk).update(best_epoch=0, epochs=2)
    report = services.report_create(user=user, title="epochs", body=f"{{{{table runs={run.pk} columns=best_epoch,epochs}}}}")
    client.force_login(user)
    html = client.get(f"/reports/{report.pk}/").content.decode()
    [row] = re.findall(r'<tr data-run="\d+">(.*?)</tr>', html)
    assert re.findall(r"<td>(?:<a [^>]*>)?([^<]*)", row) == ["1", "2"]  # the runs list: "best 1 of 2"
