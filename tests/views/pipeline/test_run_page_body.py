"""The run page's body below its tags is rendered once for every viewer (runs.web.run_page): another
viewer's load renders none of it, yet gets a page of their own around it (their name, their CSRF tokens,
forms that post); a stage write renders it again at once, with the change; a review and a tag show on
the next load. Real views, signed in with a password, committed writes (transactional tests)."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.test import Client

from runs.models import StageStatus, TrainingRun
from runs.pipeline import services
from runs.pipeline.launch.run_config import RunConfig
from runs.review.reviews import review_add

pytestmark = pytest.mark.django_db(transaction=True)
BODY = "runs/pipeline/_run_body.html"


@pytest.fixture
def run(user, roots):
    cache.clear()  # the process's cache outlives a test; this one counts renders from nothing
    return services.run_launch(user=user, target_path=roots / "target", dataset_path=roots / "chats.jsonl",
                               config=RunConfig(), enqueue=False)


@pytest.fixture
def rita(django_user_model):
    other = django_user_model.objects.create_user("rita", password="pw-rita-1")
    other.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    return other


def _signed_in(username: str, password: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    assert client.login(username=username, password=password)
    return client


def _tokens(html: str) -> list[str]:
    return re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)


def test_another_viewer_gets_the_body_built_once_inside_a_page_of_their_own(user, rita, run):
    mine = _signed_in(user.username, user.raw_password).get(run.get_absolute_url())
    assert BODY in [t.name for t in mine.templates]
    theirs = _signed_in("rita", "pw-rita-1").get(run.get_absolute_url())
    names = [t.name for t in theirs.templates]
    assert theirs.status_code == 200 and "runs/pipeline/run_detail.html" in names and BODY not in names
    mine_html, theirs_html = mine.content.decode(), theirs.content.decode()
    assert ">launcher</a>" in mine_html and ">rita</a>" in theirs_html and ">launcher</a>" not in theirs_html
    assert len(_tokens(theirs_html)) >= 3 and set(_tokens(mine_html)).isdisjoint(_tokens(theirs_html))
    # The body itself is nobody's: no form, no token, no viewer's name; both pages carry it as it is.
    body = str(theirs.context["body"])
    assert 'id="stages"' in body and 'id="checkpoints"' in body
    assert "csrfmiddlewaretoken" not in body and "rita" not in body and "<form" not in body
    assert body in mine_html and body in theirs_html


def test_a_stage_write_renders_the_body_again_at_once(user, rita, run):
    viewer = _signed_in("rita", "pw-rita-1")
    assert BODY in [t.name for t in viewer.get(run.get_absolute_url()).templates]
    assert BODY not in [t.name for t in viewer.get(run.get_absolute_url()).templates]
    # Any write to a stage row moves the run's counter (here the ORM itself, as the admin would).
    TrainingRun.objects.filter(run=run).update(status=StageStatus.FAILED, error="edited in the admin")
    again = viewer.get(run.get_absolute_url())
    assert BODY in [t.name for t in again.templates]
    assert "edited in the admin" in str(again.context["body"])


def test_a_tag_and_a_review_show_on_the_next_load(user, rita, run):
    owner = _signed_in(user.username, user.raw_password)
    page = owner.get(run.get_absolute_url()).content.decode()
    posted = owner.post(f"/runs/{run.pk}/tags/", {"tags": "kept-body", "csrfmiddlewaretoken": _tokens(page)[-1]})
    assert posted.status_code == 302
    review_add(user=rita, subject=run, decision="comment", text="seen beside the cached body?")
    after = owner.get(run.get_absolute_url())
    assert BODY not in [t.name for t in after.templates]  # neither write moves the run's counter
    html = after.content.decode()
    assert 'value="kept-body"' in html and "seen beside the cached body?" in html
