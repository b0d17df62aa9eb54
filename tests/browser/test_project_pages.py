"""A person opens Projects from the nav, creates a project, adds a member, renames it and moves a run into
it, in headless Chromium against a live server (issue 37); what the pages say is what the database holds."""
import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from runs.models import PipelineRun, Project, ProjectMember
from tests.views.runs_in_bulk import runs_made

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_project_is_created_given_a_member_renamed_and_given_a_run(live_server, user, roots, page):
    run, = runs_made(1, roots=roots, user=user, names=["moved run"])
    get_user_model().objects.create_user("ana")
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")

    page.click("nav >> text=Projects")
    page.fill('#project-form input[name="name"]', "kimi drafts")
    page.click("#project-form button[type=submit]")
    expect(page.locator("h1")).to_have_text("Project kimi drafts")
    project = Project.objects.get(name="kimi drafts")
    assert page.url == f"{live_server.url}/projects/{project.pk}/"

    page.fill('#member-form input[name="username"]', "ana")
    page.select_option('#member-form select[name="role"]', "editor")
    page.click("#member-form button[type=submit]")
    expect(page.locator('#member-table tr[data-member="ana"] td[data-role]')).to_have_text("editor")
    assert ProjectMember.objects.get(project=project, user__username="ana").role == "editor"

    page.fill('#rename-form input[name="name"]', "kimi drafts v2")
    page.click('#rename-form button[name="rename"]')
    expect(page.locator("h1")).to_have_text("Project kimi drafts v2")
    assert Project.objects.get(pk=project.pk).name == "kimi drafts v2"

    page.fill('#move-form input[name="ids"]', str(run.pk))
    page.click('#move-form button[name="move"]')
    expect(page.locator("body")).to_contain_text("Moved 1 run into kimi drafts v2.")
    assert PipelineRun.objects.get(pk=run.pk).project_id == project.pk
    page.click("#project-runs")  # the runs list, filtered on the project: the moved run
    expect(page.locator("#run-table tbody tr td:nth-child(2) a")).to_have_text(["moved run"])

    page.click("nav >> text=Projects")
    row = page.locator(f'#project-table tr[data-project="{project.pk}"]')
    expect(row).to_contain_text("kimi drafts v2")
    expect(row.locator("td").nth(1)).to_have_text("owner")
    expect(row.locator("td").nth(2)).to_have_text("1")
