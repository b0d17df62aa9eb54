"""`make demo`'s build failed: the launch page says why, in the failure's sentence (workers.contract.failures),
and offers "Build the demo target again", which queues the failed build's own folder and settings again
through the outbox (runs.pipeline.jobs.services.demo_build_again); the page then shows the new build's step.

The failed row is made by the real job: a worker's stage_execute running the demo build into a folder it
cannot create (its parent is a file)."""
import re

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from runs.models import PendingEnqueue
from runs.pipeline.jobs import services as job_services
from runs.pipeline.jobs.models import DemoBuild
from workers.orchestration.tasks import stage_execute

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed_build(tmp_path, settings, django_capture_on_commit_callbacks) -> DemoBuild:
    settings.DATA_DIR = tmp_path / "data"  # no demo built there: the machine's own data/demo must not hide the failure
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the demo's parent folder should be\n")
    with django_capture_on_commit_callbacks(execute=False):
        build = job_services.demo_build_request(out_dir=blocker / "demo", num_conversations=20, train_steps=3)
    PendingEnqueue.objects.all().delete()  # as if the broker had taken the first build's message
    assert not stage_execute(stage_name="demo_build", record_id=build.pk, worker="cpu@test")
    build.refresh_from_db()
    return build


def launch_page(client: Client) -> str:
    response = client.get("/runs/new/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_failed_demo_build_reads_as_its_sentence_with_a_button_that_builds_it_again(failed_build, user):
    out_dir = failed_build.out_dir
    assert failed_build.status == "failed"
    assert failed_build.error == (f"The demo target build could not write its files ([Errno 20] Not a directory: "
                                  f"'{out_dir}'). Make the folder writable or free disk space, then build the demo "
                                  "target again.")
    assert failed_build.error_trace.startswith("Frames, innermost last:")  # the frames, for the admin only

    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = launch_page(client)
    shown = page.split('id="demo-build-failed"')[1].split("</div>")[0]
    assert "The demo target was not built" in shown and failed_build.error.replace("'", "&#x27;") in shown
    assert 'action="/demo/build/"' in shown and "Build the demo target again</button>" in shown
    assert "Frames" not in page and "Traceback" not in page and 'id="demo-build"' not in page

    # Without the form's CSRF token: refused, nothing queued.
    assert client.post("/demo/build/").status_code == 403 and DemoBuild.objects.count() == 1
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', shown).group(1)
    response = client.post("/demo/build/", {"csrfmiddlewaretoken": token})
    assert (response.status_code, response.url) == (302, "/runs/new/")
    again = DemoBuild.objects.exclude(pk=failed_build.pk).get()
    assert (again.status, again.out_dir, again.num_conversations, again.train_steps) == ("queued", out_dir, 20, 3)
    # Handed to the broker through the outbox (the test's transaction never commits, so it stays there).
    assert list(PendingEnqueue.objects.values_list("kind", "object_id")) == [("demo_build", again.pk)]

    page = launch_page(client)
    assert f"The demo target is being built again (demo build {again.pk})" in page
    assert ("The demo target is still being built: waiting for a cpu worker to start it." in
            page.split('id="demo-build"')[1].split("</p>")[0])
    assert 'id="demo-build-failed"' not in page
    assert f'value="{out_dir}/demo-target"' in page  # the form offers the paths being built

    # A second click (another tab) queues nothing more: the build under way is the one.
    response = client.post("/demo/build/", {"csrfmiddlewaretoken": token}, follow=True)
    assert "No failed demo build is waiting to be built again" in response.content.decode()
    assert DemoBuild.objects.count() == 2 and PendingEnqueue.objects.count() == 1


def test_any_signed_in_user_may_build_it_again_and_one_who_may_not_launch_lands_on_the_runs_list(
        failed_build, django_user_model):
    viewer = django_user_model.objects.create_user("viewer", password="pw-viewer-1")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(viewer)
    response = client.post("/demo/build/")
    assert (response.status_code, response.url) == (302, "/")
    assert DemoBuild.objects.filter(status="queued", out_dir=failed_build.out_dir).count() == 1

    Client().post("/demo/build/")  # signed out: the login page, nothing queued
    assert DemoBuild.objects.count() == 2


def test_a_failed_build_is_not_shown_once_its_folder_holds_a_built_demo(failed_build, user, client, tmp_path):
    # Built by hand since (`manage.py build_demo_assets`, here its two files): the failure is history.
    built = tmp_path / "built"
    (built / "demo-target").mkdir(parents=True)
    (built / "demo-target" / "config.json").write_text("{}")
    (built / "demo-chats.jsonl").write_text("{}\n")
    DemoBuild.objects.filter(pk=failed_build.pk).update(out_dir=str(built))
    client.force_login(user)
    assert 'id="demo-build-failed"' not in launch_page(client)
    assert job_services.demo_build_again() == (None, None) and DemoBuild.objects.count() == 1
