"""The projects pages (issue 37): the list (and creating a project), a project's page renaming it and moving
runs into it, for its owners and staff only; what each refuses names its field and changes nothing."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from runs.models import PipelineRun, Project, ProjectMember
from runs.projects.services import project_create, project_member_set
from tests.views.runs_in_bulk import runs_made

pytestmark = pytest.mark.django_db


def _person(name, *groups):
    account = get_user_model().objects.create_user(name, password=f"pw-{name}-1")
    for group in groups:
        account.groups.add(Group.objects.get_or_create(name=group)[0])
    return account


def test_the_list_creates_a_project_and_shows_only_ones_own(client, user):
    project_create(user=_person("olga", "launcher"), name="olga's secret")
    client.force_login(user)
    made = client.post("/projects/", {"name": "  kimi   drafts "})
    project = Project.objects.get(name="kimi drafts")
    assert made.status_code == 302 and made["Location"] == f"/projects/{project.pk}/"
    assert list(project.members.values_list("user__username", "role")) == [(user.username, "owner")]
    html = client.get("/projects/").content.decode()
    assert f'href="/projects/{project.pk}/">kimi drafts</a>' in html and "olga" not in html
    assert 'href="/projects/"' in client.get("/").content.decode()  # the nav's link
    again = client.post("/projects/", {"name": "KIMI DRAFTS"})
    assert again.status_code == 400 and "exists already" in again.content.decode()
    client.force_login(_person("vic"))  # a viewer may not create one
    assert client.post("/projects/", {"name": "vic's"}).status_code == 403
    assert sorted(Project.objects.exclude(name="Default").values_list("name", flat=True)) == ["kimi drafts", "olga's secret"]


def test_owners_rename_a_project_others_may_not(client, user):
    project = project_create(user=user, name="kimi drafts")
    project_create(user=user, name="taken")
    editor = _person("ed", "launcher")
    project_member_set(project=project, user=user, username="ed", role="editor")
    client.force_login(editor)
    assert client.post(f"/projects/{project.pk}/", {"rename": "1", "name": "mine now"}).status_code == 403
    client.force_login(user)
    clash = client.post(f"/projects/{project.pk}/", {"rename": "1", "name": "Taken"})
    assert clash.status_code == 400 and "exists already" in clash.content.decode()
    assert Project.objects.get(pk=project.pk).name == "kimi drafts"
    renamed = client.post(f"/projects/{project.pk}/", {"rename": "1", "name": "kimi drafts v2"})
    assert renamed.status_code == 302 and Project.objects.get(pk=project.pk).name == "kimi drafts v2"
    default = Project.objects.get(name="Default")
    staff = _person("sam")
    staff.is_staff = staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    kept = client.post(f"/projects/{default.pk}/", {"rename": "1", "name": "Old runs"})
    assert kept.status_code == 400 and Project.objects.filter(name="Default").exists()


def test_owners_move_runs_into_their_project(client, user, roots):
    mine, = runs_made(1, roots=roots, user=user, names=["mine"])
    olga = _person("olga", "launcher")
    project_create(user=olga, name="olga's secret")
    hidden, = runs_made(1, roots=roots, user=olga, project="olga's secret", names=["hidden"])
    project = project_create(user=user, name="kimi drafts")
    client.force_login(user)
    # One run the user does not see refuses the whole move, naming it as if it did not exist.
    refused = client.post(f"/projects/{project.pk}/", {"move": "1", "ids": f"{mine.pk}, {hidden.pk}"})
    assert refused.status_code == 400 and f"no run {hidden.pk}" in refused.content.decode()
    assert PipelineRun.objects.get(pk=mine.pk).project.name == "Default"
    bad = client.post(f"/projects/{project.pk}/", {"move": "1", "ids": "12; drop"})
    assert bad.status_code == 400 and "is not a run id" in bad.content.decode()
    moved = client.post(f"/projects/{project.pk}/", {"move": "1", "ids": str(mine.pk)})
    assert moved.status_code == 302 and PipelineRun.objects.get(pk=mine.pk).project_id == project.pk
    # Now only the project's members see it: olga, a launcher, saw it in Default and no longer does.
    client.force_login(olga)
    assert client.get(f"/runs/{mine.pk}/").status_code == 404
    # An editor of the project may not move runs into it (owners and staff only).
    project_member_set(project=project, user=user, username="olga", role="editor")
    assert client.post(f"/projects/{project.pk}/", {"move": "1", "ids": str(hidden.pk)}).status_code == 403
    assert PipelineRun.objects.get(pk=hidden.pk).project.name == "olga's secret"
    assert ProjectMember.objects.filter(project=project).count() == 2
