"""`eagle3web projects ...` and `runs launch --project --notes` as a real subprocess against a real server
(issue 37): what the command asks for is what the database then holds; a refusal names its field and
changes nothing."""
from __future__ import annotations

import json

from runs.models import PipelineRun, Project, ProjectMember
from runs.projects.models import default_project_pk
from tests.api.conftest import make_user
from tests.client.test_cli import cli


def test_projects_are_created_listed_and_given_members_from_the_shell(live_server, launcher_token, roots):
    # The open Default project comes with the migrations; an earlier live-server test's flush removed it,
    # and the app makes it again on demand (default_project_pk), as here: the list below names it.
    default_project_pk()
    make_user("ana")
    url, token = live_server.url, launcher_token
    code, out, err = cli("projects", "create", "kimi drafts", url=url, token=token)
    project = Project.objects.get(name="kimi drafts")
    assert (code, out, err) == (0, f"{project.pk}\n", "")
    assert list(project.members.values_list("user__username", "role")) == [("cluster-bot", "owner")]
    code, out, _ = cli("--json", "projects", "list", url=url, token=token)
    assert code == 0 and {p["name"]: p["role"] for p in json.loads(out)} == {"Default": "editor", "kimi drafts": "owner"}
    code, out, _ = cli("projects", "list", url=url, token=token)
    assert f"{project.pk}\towner\t0\tkimi drafts" in out.splitlines()

    code, out, err = cli("projects", "members", "add", "kimi drafts", "ana", "--role", "editor", url=url, token=token)
    assert (code, err) == (0, "") and out.splitlines() == ["ana\teditor", "cluster-bot\towner"]
    assert ProjectMember.objects.get(project=project, user__username="ana").role == "editor"
    code, out, _ = cli("projects", "members", "list", str(project.pk), url=url, token=token)
    assert code == 0 and out.splitlines() == ["ana\teditor", "cluster-bot\towner"]

    # Launched into it by name, with notes; launched without --project, into Default all the same.
    base = ("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset", str(roots / "chats.jsonl"))
    code, out, err = cli(*base, "--project", "kimi drafts", "--notes", "baseline, 2 epochs", url=url, token=token)
    assert code == 0, err
    run = PipelineRun.objects.get(pk=json.loads(out)["id"])
    assert (run.project.name, run.notes) == ("kimi drafts", "baseline, 2 epochs")
    code, out, err = cli(*base, url=url, token=token)
    assert code == 0 and PipelineRun.objects.get(pk=json.loads(out)["id"]).project.name == "Default"

    code, out, err = cli("projects", "members", "remove", "kimi drafts", "ana", url=url, token=token)
    assert (code, out, err) == (0, "removed ana from kimi drafts\n", "")
    assert not ProjectMember.objects.filter(project=project, user__username="ana").exists()


def test_project_refusals_name_their_field_and_change_nothing(live_server, launcher_token, roots):
    url, token = live_server.url, launcher_token
    cli("projects", "create", "kimi drafts", url=url, token=token)
    code, out, _ = cli("--json", "projects", "members", "add", "no such project", "cluster-bot", url=url, token=token)
    assert code == 1 and list(json.loads(out)["fields"]) == ["project"]
    code, out, _ = cli("--json", "projects", "members", "add", "kimi drafts", "nobody", url=url, token=token)
    assert code == 1 and json.loads(out)["status"] == 400 and list(json.loads(out)["fields"]) == ["username"]
    # The last owner cannot be removed; a user who is not a member is a 404.
    code, out, _ = cli("--json", "projects", "members", "remove", "kimi drafts", "cluster-bot", url=url, token=token)
    assert code == 1 and list(json.loads(out)["fields"]) == ["username"]
    make_user("ana")
    code, out, _ = cli("--json", "projects", "members", "remove", "kimi drafts", "ana", url=url, token=token)
    assert code == 1 and json.loads(out)["status"] == 404
    code, out, _ = cli("--json", "projects", "create", "Kimi Drafts", url=url, token=token)
    assert code == 1 and list(json.loads(out)["fields"]) == ["name"]
    code, out, _ = cli("--json", "runs", "launch", "--target", str(roots / "target"), "--dataset",
                       str(roots / "chats.jsonl"), "--project", "not mine", url=url, token=token)
    assert code == 1 and list(json.loads(out)["fields"]) == ["project"]
    assert list(Project.objects.exclude(name="Default").values_list("name", flat=True)) == ["kimi drafts"]
    assert list(ProjectMember.objects.values_list("user__username", "role")) == [("cluster-bot", "owner")]
    assert not PipelineRun.objects.exists()
