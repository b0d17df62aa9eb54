"""Who may act on a run (cancel, retry, tag): its owner and admins; another user with the role only
when they share a team with the owner (a group that is not a role) and the owner allowed it on their
account page. The same rule for the pages, the API and the services (runs.roles.require_on_run)."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.test import Client

from runs.models import PipelineRun, StageStatus
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.review.tags import run_tags_set
from tests.api.conftest import make_user

pytestmark = pytest.mark.django_db


def launch(user, roots) -> PipelineRun:
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(draft_vocab_size=64))


def page(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def statuses(run) -> set[str]:
    return {record.status for record in (run.preparation, run.extract_stage, run.vocab_mapping, run.training_run,
                                         run.evaluation)}


def fresh(run) -> PipelineRun:
    return PipelineRun.objects.get(pk=run.pk)


def test_another_launcher_may_not_cancel_retry_or_tag_a_run_anywhere(people, api, roots):
    run = launch(people["launcher"][0], roots)
    other = people["other_launcher"][0]
    for url, body in ((f"/api/v1/runs/{run.pk}/cancel/", None), (f"/api/v1/runs/{run.pk}/retry/", None),
                      (f"/api/v1/runs/{run.pk}/tags/", {"tags": ["mine"]})):
        response = api("other_launcher").post(url, body)
        assert response.status_code == 403
        assert "api-launcher-2 may not" in response.json()["error"] and "it is api-launcher's" in response.json()["error"]
    for url in (f"/runs/{run.pk}/cancel/", f"/runs/{run.pk}/retry/", f"/runs/{run.pk}/tags/"):
        response = page(other).post(url, {"tags": "mine"})
        assert response.status_code == 403 and b"it is api-launcher&#x27;s" in response.content
    with pytest.raises(PermissionDenied):
        services.run_cancel(run=run, user=other)
    with pytest.raises(PermissionDenied):
        run_tags_set(run=run, text="mine", user=other)
    assert statuses(fresh(run)) == {StageStatus.QUEUED} and not run.tags.exists()


def test_the_owner_and_an_admin_act_on_it(people, api, roots):
    run = launch(people["launcher"][0], roots)
    assert page(people["launcher"][0]).post(f"/runs/{run.pk}/tags/", {"tags": "by owner"}).status_code == 302
    assert api("admin").post(f"/api/v1/runs/{run.pk}/tags/", {"tags": ["by admin"]}).json()["tags"] == ["by admin"]
    assert api("admin").post(f"/api/v1/runs/{run.pk}/cancel/").json()["cancelled"] == 5
    assert api("launcher").post(f"/api/v1/runs/{run.pk}/retry/").json()["queued"] == 5


def test_a_teammate_acts_only_once_the_owner_allows_it(people, api, roots):
    owner, mate = people["launcher"][0], people["other_launcher"][0]
    team = Group.objects.create(name="team-draft")
    owner.groups.add(team)
    mate.groups.add(team)
    outsider = make_user("api-outsider", "launcher")
    viewer_mate = people["viewer"][0]
    viewer_mate.groups.add(team)
    run = launch(owner, roots)
    assert api("other_launcher").post(f"/api/v1/runs/{run.pk}/cancel/").status_code == 403  # off by default
    assert page(owner).post("/account/team/", {"team_may_act": "on"}).status_code == 302
    assert api("launcher").get("/api/v1/me/").json()["team_may_act"] is True
    assert api("other_launcher").post(f"/api/v1/runs/{run.pk}/cancel/").json()["cancelled"] == 5
    assert page(mate).post(f"/runs/{run.pk}/retry/").status_code == 302
    assert statuses(fresh(run)) == {StageStatus.QUEUED}
    with pytest.raises(PermissionDenied):  # not in the team
        services.run_cancel(run=run, user=outsider)
    refused = api("viewer").post(f"/api/v1/runs/{run.pk}/cancel/")  # in the team, without the role
    assert refused.status_code == 403 and "ask an admin for the admin or launcher role" in refused.json()["error"]
    page(owner).post("/account/team/", {})  # turned off again
    assert api("other_launcher").post(f"/api/v1/runs/{run.pk}/cancel/").status_code == 403


def test_roles_are_not_teams(people, api, roots):
    """Two launchers share the launcher group: that makes no team of them."""
    owner = people["launcher"][0]
    page(owner).post("/account/team/", {"team_may_act": "on"})
    run = launch(owner, roots)
    assert api("other_launcher").post(f"/api/v1/runs/{run.pk}/cancel/").status_code == 403
