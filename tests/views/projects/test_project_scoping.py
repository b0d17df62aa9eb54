"""A run of a closed project is hidden from non-members everywhere it shows (runs.projects.access): its live
status poll (cached for every viewer), its checkpoints' pages and APIs, its sweep, the report blocks that
name it and the alerts of team rules. Each check asks as a non-member (404, or "no run N") and as a member
(the answer itself), through the real views, PostgreSQL and the services the pages use."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from runs.alerts import events
from runs.alerts.models import AlertNotice
from runs.alerts.services import RuleInput, rule_create
from runs.models import Checkpoint, ServeCheck
from runs.pipeline.launch.run_config import RunConfig
from runs.projects.services import project_create, project_member_set
from runs.reports.services import report_create
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary
from tests.views.runs_in_bulk import runs_made

pytestmark = pytest.mark.django_db


def _person(name, *groups):
    account = get_user_model().objects.create_user(name, password=f"pw-{name}-1", email=f"{name}@example.com")
    for group in groups:
        account.groups.add(Group.objects.get_or_create(name=group)[0])
    return account


@pytest.fixture
def secret(user):
    return project_create(user=user, name="secret")


@pytest.fixture
def hidden_run(user, roots, secret):
    run, = runs_made(1, roots=roots, user=user, project="secret", names=["hidden run"])
    return run


@pytest.fixture
def checkpoint(hidden_run, tmp_path):
    return Checkpoint.objects.create(training_run=hidden_run.training_run, epoch=0, path=str(tmp_path / "ckpt-0"))


def test_the_status_poll_is_404_to_a_non_member_even_when_a_member_cached_it(client, user, hidden_run, secret):
    url = f"/api/v1/runs/{hidden_run.pk}/status/"
    client.force_login(user)
    first = client.get(url)
    assert first.status_code == 200 and first.json()["stages"][0]["name"] == "prepare"
    tag = first["ETag"]
    client.force_login(_person("olga", "launcher"))
    assert client.get(url).status_code == 404
    # Her poll with the member's ETag gets no 304 either: the counter's read found no run she sees.
    assert client.get(url, HTTP_IF_NONE_MATCH=tag).status_code == 404
    project_member_set(project=secret, user=user, username="olga", role="viewer")
    assert client.get(url).status_code == 200
    assert client.get(url, HTTP_IF_NONE_MATCH=tag).status_code == 304


def test_a_checkpoint_of_a_hidden_run_is_404_on_its_page_and_apis(client, user, secret, checkpoint):
    olga = _person("olga", "launcher")
    client.force_login(olga)
    reads = [f"/checkpoints/{checkpoint.pk}/", f"/api/v1/checkpoints/{checkpoint.pk}/",
             f"/api/v1/checkpoints/{checkpoint.pk}/generations/"]
    writes = [(f"/checkpoints/{checkpoint.pk}/evaluate/", {}), (f"/checkpoints/{checkpoint.pk}/serve-check/", {})]
    for url in reads:
        assert client.get(url).status_code == 404, url
    for url, data in writes:
        assert client.post(url, data).status_code == 404, url
    api_evaluate = client.post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/", {}, content_type="application/json")
    assert api_evaluate.status_code == 404
    assert not checkpoint.evaluations.exists() and not ServeCheck.objects.exists()
    project_member_set(project=secret, user=user, username="olga", role="editor")
    assert client.get(reads[0]).status_code == 200
    assert client.get(reads[1]).json()["id"] == checkpoint.pk
    assert client.get(reads[2]).json()["checkpoint"] == checkpoint.pk
    # The member's writes reach the views' own answers: the page's redirect back, the API's refusal or queue.
    for url, data in writes:
        answer = client.post(url, data)
        assert answer.status_code == 302 and answer["Location"] == f"/checkpoints/{checkpoint.pk}/", url
    api_evaluate = client.post(f"/api/v1/checkpoints/{checkpoint.pk}/evaluate/", {}, content_type="application/json")
    assert api_evaluate.status_code in (200, 202, 400) and api_evaluate.status_code != 404


def test_an_imported_checkpoint_belongs_to_no_project(client, tmp_path, user):
    imported = Checkpoint.objects.create(epoch=0, path=str(tmp_path / "imported"), imported_by=user,
                                         imported_at=user.date_joined)
    client.force_login(_person("olga", "launcher"))
    assert client.get(f"/api/v1/checkpoints/{imported.pk}/").json()["id"] == imported.pk


def test_a_sweep_of_a_hidden_project_is_404_on_its_page_and_api(client, user, roots, secret):
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(), varied=[parse_vary("seed=1,2")], project=secret)
    assert set(sweep.entries.values_list("run__project__name", flat=True)) == {"secret"}
    client.force_login(_person("olga", "launcher", "admin"))
    assert client.get(f"/sweeps/{sweep.pk}/").status_code == 404
    assert client.get(f"/api/v1/sweeps/{sweep.pk}/").status_code == 404
    assert client.post(f"/sweeps/{sweep.pk}/cancel/").status_code == 404
    assert f'href="/sweeps/{sweep.pk}/"' not in client.get("/sweeps/").content.decode()
    project_member_set(project=secret, user=user, username="olga", role="viewer")
    assert client.get(f"/sweeps/{sweep.pk}/").status_code == 200
    assert f'href="/sweeps/{sweep.pk}/"' in client.get("/sweeps/").content.decode()
    assert len(client.get(f"/api/v1/sweeps/{sweep.pk}/").json()["run_ids"]) == 2


def test_report_blocks_name_a_hidden_run_as_unknown(client, user, hidden_run, secret):
    body = f"# r\n\n{{{{table runs={hidden_run.pk} columns=name}}}}\n\n{{{{chart run={hidden_run.pk} metric=loss}}}}\n"
    report = report_create(user=user, title="r", body=body)
    client.force_login(_person("olga"))
    answer = client.get(f"/api/v1/reports/{report.pk}/").json()
    assert answer["errors"] == [f"table: no run {hidden_run.pk}", f"chart: no run {hidden_run.pk}"]
    page = client.get(f"/reports/{report.pk}/").content.decode()
    assert "hidden run" not in page and f"no run {hidden_run.pk}" in page
    assert "hidden run" not in client.get(f"/reports/{report.pk}/export/").content.decode()
    project_member_set(project=secret, user=user, username="olga", role="viewer")
    answer = client.get(f"/api/v1/reports/{report.pk}/").json()
    assert answer["errors"] == [] and answer["blocks"][0]["rows"][0]["cells"] == ["hidden run"]


def test_a_team_rule_does_not_tell_a_teammate_of_a_run_they_cannot_see(user, hidden_run, secret):
    team = Group.objects.create(name="draft-team")
    lead, outsider = _person("lead"), _person("outsider")
    for member in (user, lead, outsider):
        member.groups.add(team)
    project_member_set(project=secret, user=user, username="lead", role="viewer")
    rule_create(user=lead, data=RuleInput(event="run_failed", team="draft-team", email=True))
    assert events.run_failed(run_id=hidden_run.pk, stage_name="prepare", error="boom") == 1
    assert sorted(AlertNotice.objects.values_list("user__username", flat=True)) == ["launcher", "lead"]


def test_a_team_rule_of_a_non_member_does_not_fire_for_the_run(user, hidden_run):
    team = Group.objects.create(name="draft-team")
    outsider = _person("outsider")
    for member in (user, outsider):
        member.groups.add(team)
    rule_create(user=outsider, data=RuleInput(event="run_failed", team="draft-team",
                                              webhook_url=""))
    assert events.run_failed(run_id=hidden_run.pk, stage_name="prepare", error="boom") == 0
    assert not AlertNotice.objects.exists()


def test_a_members_run_page_names_its_project_and_links_its_members_page(client, user, hidden_run, secret):
    client.force_login(user)
    page = client.get(f"/runs/{hidden_run.pk}/").content.decode()
    assert f'project <a href="/projects/{secret.pk}/" id="run-project">secret</a>' in page


def test_a_checkpoints_label_counts_epochs_from_one_as_the_pages_do(checkpoint, hidden_run):
    assert str(checkpoint) == f"epoch 1 of run {hidden_run.pk}"  # the trainer's epoch 0


def test_a_sweep_split_across_projects_shows_each_viewer_the_runs_they_see(client, user, roots, secret):
    """Staff moved one run of a sweep to a closed project: a non-member sees the sweep with the other runs,
    is told one is left out, its best and counts are of those she sees, and her cancel stops only hers."""
    from runs.models import PipelineRun, Project

    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(), varied=[parse_vary("seed=1,2,3")])
    open_project = Project.objects.create(name="open", open_to_all=True, created_by=user)
    ids = list(sweep.entries.order_by("position").values_list("run_id", flat=True))
    PipelineRun.objects.filter(pk__in=ids[:2]).update(project=open_project)
    PipelineRun.objects.filter(pk=ids[2]).update(project=secret)
    client.force_login(_person("olga", "launcher", "admin"))  # the admin role, not staff: projects still apply

    page = client.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert f'data-run="{ids[2]}"' not in page and all(f'data-run="{pk}"' in page for pk in ids[:2])
    assert "1 more run of this sweep is in a project you do not see" in page
    assert "of the 2 you see" in page and "0 of 2 runs measured" in page
    summary = client.get(f"/api/v1/sweeps/{sweep.pk}/").json()
    assert (summary["run_ids"], summary["hidden_runs"]) == (ids[:2], 1)
    listed = client.get("/sweeps/").content.decode()
    assert f'href="/sweeps/{sweep.pk}/"' in listed
    assert '<td>2 <span class="hint">(+1 in a project you do not see)</span></td>' in listed

    client.post(f"/sweeps/{sweep.pk}/cancel/")
    statuses = dict(PipelineRun.objects.filter(pk__in=ids).values_list("pk", "preparation__status"))
    assert [statuses[pk] for pk in ids] == ["cancelled", "cancelled", "queued"]  # the hidden one runs on
    client.force_login(user)  # the launcher, a member of "secret": every run, none left out
    assert client.get(f"/api/v1/sweeps/{sweep.pk}/").json()["hidden_runs"] == 0
    assert "<td>3</td>" in client.get("/sweeps/").content.decode()


def test_staff_open_a_sweep_whose_runs_are_all_gone(client, user, roots, django_user_model):
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(), varied=[parse_vary("seed=1,2")])
    sweep.entries.all().delete()  # as when every run of it was deleted in the admin
    client.force_login(django_user_model.objects.create_user("sam", password="pw-sam-1", is_staff=True))
    assert client.get(f"/sweeps/{sweep.pk}/").status_code == 200
    client.force_login(_person("olga", "launcher"))
    assert client.get(f"/sweeps/{sweep.pk}/").status_code == 404  # no run of it she sees
