"""What every signed-in request reads first (the session, the user, the run's counters where its project lets the
user see it: runs.api.account.sessions, runs.projects.visible_run) is read from PostgreSQL each time, so
taking access away works at once, for the curve read, the status poll and the run page's one poll of both,
whose answers are cached for every viewer (runs.live): a session signed out, in this process or another, a user made inactive or given a new
password, a member removed from the run's project and a staff member demoted lose them on their next request. Through the real views, signed in with a
password, on PostgreSQL."""
from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs.projects.services import project_create, project_member_set
from runs.tracking.services import metrics_record
from tests.views.runs_in_bulk import runs_made

pytestmark = pytest.mark.django_db


@pytest.fixture
def hidden_run(user, roots):
    """A run of the closed project `secret` (its maker `launcher` owns it), with a curve of 9 points."""
    project_create(user=user, name="secret")
    run, = runs_made(1, roots=roots, user=user, project="secret", names=["hidden run"])
    metrics_record(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": "loss", "step": s, "epoch": s / 100, "value": 10.0 / s} for s in range(1, 10)])
    return run


def _urls(run) -> tuple[str, str, str]:
    """The curve read, the status poll, and the run page's one poll of both (runs.api.views.run_poll)."""
    return (f"/api/v1/runs/{run.pk}/metrics/?keys=loss&split=train&points=2000", f"/api/v1/runs/{run.pk}/status/",
            f"/api/v1/runs/{run.pk}/status/?curves_start=5")


def _signed_in(username: str, password: str) -> Client:
    client = Client()
    assert client.login(username=username, password=password)
    return client


def _read_both(client: Client, run) -> list[int]:
    """Each URL twice, the second time with the first answer's ETag: what a page's polls do."""
    codes = []
    for url in _urls(run):
        first = client.get(url)
        if first.status_code == 200 and "curves_start" in url:
            assert set(first.json()) == {"status", "curves"}, first.content[:200]
        codes += [first.status_code, client.get(url, HTTP_IF_NONE_MATCH=first.get("ETag", "")).status_code]
    return codes


def test_a_session_signed_out_elsewhere_reads_nothing_at_once(user, hidden_run):
    page = _signed_in(user.username, user.raw_password)
    copy = Client()  # the same cookie, as another tab (or whoever copied it) sends it
    copy.cookies[settings.SESSION_COOKIE_NAME] = page.cookies[settings.SESSION_COOKIE_NAME].value
    assert _read_both(copy, hidden_run) == [200, 304] * 3
    page.logout()
    assert _read_both(copy, hidden_run) == [401, 401] * 3


def test_a_session_whose_row_is_gone_reads_nothing_at_once(user, hidden_run):
    """Another web process's sign-out deletes the row; so does staff's cleaning up: no process keeps a copy."""
    client = _signed_in(user.username, user.raw_password)
    assert _read_both(client, hidden_run) == [200, 304] * 3
    Session.objects.filter(session_key=client.session.session_key).delete()
    assert _read_both(client, hidden_run) == [401, 401] * 3


def test_a_member_removed_from_the_project_loses_its_run_at_once(user, hidden_run):
    get_user_model().objects.create_user("olga", password="pw-olga-1")
    project = hidden_run.project
    project_member_set(project=project, user=user, username="olga", role="viewer")
    olga = _signed_in("olga", "pw-olga-1")
    assert _read_both(olga, hidden_run) == [200, 304] * 3
    project_member_set(project=project, user=user, username="olga", role=None)
    assert _read_both(olga, hidden_run) == [404, 404] * 3
    project_member_set(project=project, user=user, username="olga", role="viewer")
    assert _read_both(olga, hidden_run) == [200, 304] * 3


def test_staff_made_a_plain_user_lose_every_project_at_once(user, hidden_run):
    """Staff see every project: the statement read for them names no user, another's does (runs.projects.visible_run)."""
    get_user_model().objects.create_user("sam", password="pw-sam-1", is_staff=True)
    sam = _signed_in("sam", "pw-sam-1")
    assert _read_both(sam, hidden_run) == [200, 304] * 3
    get_user_model().objects.filter(username="sam").update(is_staff=False)
    assert _read_both(sam, hidden_run) == [404, 404] * 3


def test_a_user_made_inactive_or_given_a_new_password_reads_nothing_at_once(user, hidden_run):
    client = _signed_in(user.username, user.raw_password)
    assert _read_both(client, hidden_run) == [200, 304] * 3
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert _read_both(client, hidden_run) == [401, 401] * 3
    get_user_model().objects.filter(pk=user.pk).update(is_active=True)
    client = _signed_in(user.username, user.raw_password)
    user.set_password("pw-launcher-2")
    user.save()
    assert _read_both(client, hidden_run) == [401, 401] * 3


def test_a_session_made_before_the_users_read_was_compiled_stays_signed_in(user, hidden_run):
    """Sessions name the backend that signed them in: Django's ModelBackend, before UserBackend was listed."""
    client = Client()
    client.force_login(user, backend="django.contrib.auth.backends.ModelBackend")
    assert _read_both(client, hidden_run) == [200, 304] * 3


def test_the_repeated_curve_read_reads_three_rows_and_builds_no_statement(user, hidden_run, monkeypatch):
    """Session, user, the run's counter where the user sees it: statements compiled once (issue 40). Measured:
    3 queries, no ORM compilation (3 before, each query's own)."""
    client = _signed_in(user.username, user.raw_password)
    url = _urls(hidden_run)[0]
    assert client.get(url).status_code == 200
    compiled = []
    original = SQLCompiler.as_sql
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda self, *a, **k: compiled.append(self.query.model) or
                        original(self, *a, **k))
    with CaptureQueriesContext(connection) as queries:
        again = client.get(url)
    assert again.status_code == 200 and again.json()["series"][0]["steps"] == list(range(1, 10))
    assert len(queries.captured_queries) == 3
    assert [q["sql"].split(" FROM ")[1].split()[0] for q in queries.captured_queries] == [
        '"django_session"', '"auth_user"', '"runs_pipelinerun"']
    assert compiled == []
