"""A failed `make demo` build, in headless Chromium: the launch page says why and its "Build the demo target
again" button queues the build again, after which the page shows the new build's progress
(tests/views/pipeline/test_demo_build_failed.py has the rest: CSRF, the outbox, who may press it)."""
import pytest
from playwright.sync_api import expect

from runs.pipeline.jobs import services as job_services
from runs.pipeline.jobs.models import DemoBuild
from tests.browser.launch.test_launch_form import log_in
from workers.orchestration.tasks import stage_execute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_button_builds_the_failed_demo_again_and_the_page_shows_its_progress(live_server, user, page, tmp_path,
                                                                                settings):
    settings.DATA_DIR = tmp_path / "data"  # no demo built there
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the demo's parent folder should be\n")
    build = job_services.demo_build_request(out_dir=blocker / "demo", num_conversations=20, train_steps=3)
    assert not stage_execute(stage_name="demo_build", record_id=build.pk, worker="cpu@test")
    build.refresh_from_db()

    log_in(page, live_server, user)
    page.goto(live_server.url + "/runs/new/")
    failed = page.locator("#demo-build-failed")
    expect(failed).to_contain_text(build.error)
    expect(failed).to_contain_text("Make the folder writable or free disk space")
    page.click("#demo-build-again")

    expect(page.locator("#demo-build")).to_have_text(
        "The demo target is still being built: waiting for a cpu worker to start it. A launch of it is refused until "
        "it is ready: reload this page to see how far it is.")
    expect(page.locator("#demo-build-failed")).to_have_count(0)
    assert page.url == live_server.url + "/runs/new/"
    again = DemoBuild.objects.exclude(pk=build.pk).get()
    assert (again.status, again.out_dir) == ("queued", build.out_dir)
