"""A sweep's run that its sweep holds back (issue 28) is "held" wherever a run's status is shown or
filtered: the sweep page, the runs list and its status filter, the API's list, filter, run and schema;
with the reason in words where there is room."""
import pytest

from runs.api import tokens
from runs.models import PipelineRun, SweepRun
from runs.pipeline import selectors as run_selectors
from runs.pipeline.status.run_status import run_status, run_status_reason
from runs.pipeline.status.run_summary import run_summary
from runs.pipeline import services as run_services
from runs.pipeline.launch.run_config import RunConfig
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary

pytestmark = pytest.mark.django_db

REASON = "held: its sweep runs at most 1 at once"


@pytest.fixture
def sweep(user, roots):
    return sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                        config=RunConfig(draft_vocab_size=64), name="held sweep",
                        varied=[parse_vary("seed=1,2,3")], parallel=1)


@pytest.fixture
def ids(sweep):
    return list(SweepRun.objects.filter(sweep=sweep).order_by("position").values_list("run_id", flat=True))


def bearer(user) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.token_create(user=user, name='held tests')[1]}"}


def test_run_status_says_held_and_why(ids):
    first, second, _ = ids
    runs = {run.pk: run for run in run_selectors.run_rows().filter(pk__in=ids)}
    assert [run_status(runs[pk]) for pk in ids] == ["queued", "held", "held"]
    assert run_status_reason(runs[second]) == REASON
    assert run_status_reason(runs[first]) == ""
    summary = run_summary(run_selectors.run_get(pk=second))
    assert summary["status"] == "held" and summary["status_reason"] == REASON


def test_a_held_run_cancelled_is_cancelled_not_held(user, ids):
    run_services.run_cancel(run=PipelineRun.objects.get(pk=ids[1]), user=user)
    run = run_selectors.run_get(pk=ids[1])
    assert run_status(run) == "cancelled" and run_status_reason(run) == ""


def test_the_runs_list_shows_held_with_its_reason(client, user, ids):
    client.force_login(user)
    html = client.get("/").content.decode()
    first = html.split(f'<tr data-run="{ids[0]}"')[1].split("</tr>")[0]
    assert 'data-status="queued"' in first and '<span class="status queued">queued</span>' in first
    for pk in ids[1:]:
        row = html.split(f'<tr data-run="{pk}"')[1].split("</tr>")[0]
        assert 'data-status="held"' in row
        assert f'<span class="status held" title="{REASON}">held</span>' in row


def test_the_status_filter_finds_exactly_the_held_runs(client, user, ids):
    client.force_login(user)
    held = client.get("/?status=held")
    assert held.status_code == 200
    html = held.content.decode()
    assert all(f'<tr data-run="{pk}"' in html for pk in ids[1:]) and f'<tr data-run="{ids[0]}"' not in html
    queued = client.get("/?status=queued").content.decode()
    assert f'<tr data-run="{ids[0]}"' in queued and not any(f'<tr data-run="{pk}"' in queued for pk in ids[1:])
    assert "<option selected>held</option>" in html  # the filter menu offers it


def test_the_list_sorted_by_status_words_held_as_the_rows_do(client, user, ids):
    client.force_login(user)
    html = client.get("/?sort=status").content.decode()
    assert html.count('data-status="held"') == 2


def test_the_api_says_held_in_the_list_the_filter_and_the_run(client, user, ids):
    auth = bearer(user)
    rows = client.get("/api/v1/runs/", **auth).json()["results"]
    by_id = {row["id"]: row for row in rows}
    assert [by_id[pk]["status"] for pk in ids] == ["queued", "held", "held"]
    assert by_id[ids[1]]["status_reason"] == REASON and by_id[ids[0]]["status_reason"] is None
    held = client.get("/api/v1/runs/", {"status": "held"}, **auth).json()["results"]
    assert sorted(row["id"] for row in held) == sorted(ids[1:])
    queued = client.get("/api/v1/runs/", {"status": "queued"}, **auth).json()["results"]
    assert [row["id"] for row in queued] == [ids[0]]
    detail = client.get(f"/api/v1/runs/{ids[2]}/", **auth).json()
    assert detail["status"] == "held" and detail["status_reason"] == REASON
    stages = client.get(f"/api/v1/runs/{ids[2]}/stages/", **auth).json()
    assert stages["status"] == "held"


def test_the_api_schema_lists_held(client, user):
    schema = client.get("/api/v1/openapi.json", **bearer(user)).json()
    param = next(p for p in schema["paths"]["/api/v1/runs/"]["get"]["parameters"] if p["name"] == "status")
    assert "held" in param["description"] and "held" in param["schema"]["enum"]


def test_the_sweep_page_and_the_run_list_agree(client, user, sweep, ids):
    client.force_login(user)
    page = client.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert page.count(">held</span>") == 2
    summary = client.get(f"/api/v1/sweeps/{sweep.pk}/").json()
    assert [r["status"] for r in summary["runs"]] == ["queued", "held", "held"]
