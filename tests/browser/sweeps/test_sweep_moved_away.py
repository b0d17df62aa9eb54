"""The sweep page in headless Chromium while staff move its runs away: the page's poll
(static/js/compare/sweep.js, GET /api/v1/sweeps/<id>/) reloads when runs leave the viewer's sight, and says so and
stops following the sweep when none is left, with no console error but the poll's own 404."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from runs.models import PipelineRun, Project
from runs.pipeline.launch.run_config import RunConfig
from runs.projects.services import project_create
from runs.sweeps.services import sweep_launch
from runs.sweeps.spec import parse_vary
from tests.browser.every_page.test_hostile_strings import Watch
from tests.browser.every_page.test_pages_at_a_glance import _log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_sweep_page_follows_its_runs_out_of_sight(live_server, user, roots, page, django_user_model):
    sweep = sweep_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                         config=RunConfig(), varied=[parse_vary("seed=1,2")])
    ids = list(sweep.entries.order_by("position").values_list("run_id", flat=True))
    PipelineRun.objects.filter(pk__in=ids).update(project=Project.objects.create(
        name="open", open_to_all=True, created_by=user))
    secret = project_create(user=user, name="secret")
    viewer = django_user_model.objects.create_user("olga", password="pw-olga-1")
    viewer.groups.add(Group.objects.get_or_create(name="launcher")[0])
    viewer.raw_password = "pw-olga-1"
    watch = Watch(page)
    _log_in(page, live_server, viewer)
    page.goto(f"{live_server.url}/sweeps/{sweep.pk}/")
    expect(page.locator("#sweep-runs tbody tr[data-run]")).to_have_count(2)

    PipelineRun.objects.filter(pk=ids[1]).update(project=secret)  # one moved away: the page reloads
    expect(page.locator("#sweep-runs tbody tr[data-run]")).to_have_count(1, timeout=15_000)
    expect(page.locator('[data-field="hidden-runs"]')).to_contain_text("1 more run of this sweep is in a project")

    PipelineRun.objects.filter(pk=ids[0]).update(project=secret)  # none left: said, and the poll stops
    expect(page.locator("#sweep-gone")).to_contain_text("no longer in a project you see", timeout=15_000)
    assert watch.dialogs == [] and all("404 (Not Found)" in error for error in watch.errors), watch.errors
