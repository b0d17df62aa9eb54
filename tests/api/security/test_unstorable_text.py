"""Text PostgreSQL cannot store (a NUL; in JSON, a lone surrogate such as "\\ud800") is refused as input: 400
naming the field, in the API's JSON on /api/ and on the page's own 400 page elsewhere, and nothing is
stored (eagle3web/storable_text.py). Each of the issue's reproductions answered 500 before (psycopg's
DataError: "PostgreSQL text fields cannot contain NUL (0x00) bytes"; a surrogate failed to encode)."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from runs.models import ProjectMember, SavedView
from runs.projects.services import project_create
from tests.api.runs.test_api_runs import counts

pytestmark = pytest.mark.django_db

FILTERS = ["q", "tag", "owner", "target", "dataset", "project"]


@pytest.fixture
def browser(people) -> Client:
    client = Client()
    client.force_login(people["launcher"][0])
    return client


@pytest.mark.parametrize("name", FILTERS)
def test_a_nul_in_an_api_runs_filter_is_a_400_naming_it(api, name):
    answer = api("launcher").get("/api/v1/runs/", {name: "base\x00line"})
    assert answer.status_code == 400 and answer["Content-Type"] == "application/json"
    assert set(answer.json()["fields"]) == {name}
    assert "NUL" in answer.json()["fields"][name] and answer.json()["error"].startswith(f"{name} holds")


@pytest.mark.parametrize("name", FILTERS)
def test_a_nul_in_a_runs_page_filter_is_the_pages_400_naming_it(browser, name):
    answer = browser.get("/", {name: "base\x00line"})
    assert answer.status_code == 400 and answer["Content-Type"].startswith("text/html")
    page = answer.content.decode()
    assert "<h1>Not accepted</h1>" in page and f"{name.capitalize()} holds a NUL character (character 5)" in page
    assert 'href="/" id="input-refused-back"' in page  # the list again, without the refused filter


def test_a_nul_in_a_saved_views_params_is_refused_on_the_page_and_the_api(browser, api):
    before = counts()
    page = browser.post("/views/", {"name": "nul", "query": "tag=a%00b"})
    assert page.status_code == 400 and "params: tag holds a NUL character" in page.content.decode()
    body = api("launcher").post("/api/v1/saved-views/", {"name": "nul", "params": {"tag": "a\x00b"}})
    assert body.status_code == 400 and list(body.json()["fields"]) == ["params.tag"]
    assert counts() == before and not SavedView.objects.exists()


@pytest.mark.parametrize("config, field", [
    ({"lr\x00": 0.1}, "config"),                      # a key: named by where it sits
    ({"optimizer": "adam\x00w"}, "config.optimizer"),  # a value
    ({"schedule": [{"name": "\ud800"}]}, "config.schedule[0].name"),  # a lone surrogate, two levels down
])
def test_an_external_runs_config_with_unstorable_text_is_a_400_naming_where(api, config, field):
    before = counts()
    answer = api("launcher").post("/api/v1/runs/", {"external": True, "name": "elsewhere", "config": config})
    assert answer.status_code == 400 and list(answer.json()["fields"]) == [field]
    assert counts() == before


def test_a_nul_in_a_member_name_in_the_path_is_a_400_naming_it(people, api):
    project = project_create(user=people["launcher"][0], name="walled")
    answer = api("launcher").call("DELETE", f"/api/v1/projects/{project.pk}/members/ol%00ga/")
    assert answer.status_code == 400 and list(answer.json()["fields"]) == ["username"]
    assert ProjectMember.objects.filter(project=project).count() == 1


def test_a_lone_surrogate_escape_in_json_is_refused_where_an_escaped_backslash_is_not(api):
    """'\\\\ud800' in JSON is a backslash then 'ud800', which stores; '\\ud800' is the surrogate."""
    client = api("launcher")
    kept = client.client.post("/api/v1/runs/", b'{"external": true, "name": "a\\\\ud800", "config": {}}',
                              content_type="application/json", HTTP_AUTHORIZATION=client.header)
    assert kept.status_code == 201 and kept.json()["name"] == "a\\ud800"
    refused = client.client.post("/api/v1/runs/", b'{"external": true, "name": "a\\ud800", "config": {}}',
                                 content_type="application/json", HTTP_AUTHORIZATION=client.header)
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["name"]
    assert "surrogate" in refused.json()["fields"]["name"]


def test_a_surrogate_pair_is_one_character_and_is_stored(api):
    answer = api("launcher").post("/api/v1/runs/", {"external": True, "name": "draft \U0001F985", "config": {}})
    assert answer.status_code == 201 and answer.json()["name"] == "draft \U0001F985"
    assert json.dumps("\U0001F985") == '"\\ud83e\\udd85"'  # what the client sent: two escapes, one character


def test_a_nul_in_the_session_cookie_is_a_400_that_clears_it(people):
    """A quoted cookie may spell a NUL as \\000; the session's key is looked up in the database."""
    client = Client()
    for url, api in (("/", False), ("/api/v1/runs/", True)):
        answer = client.get(url, HTTP_COOKIE='sessionid="abcdefghij\\000k"')
        assert answer.status_code == 400 and answer.cookies["sessionid"].value == ""  # cleared
        if api:
            assert list(answer.json()["fields"]) == ["sessionid"]
        else:
            assert "The cookie sessionid holds a NUL character" in answer.content.decode()


def test_a_nul_in_a_form_field_is_refused_before_the_view_and_stores_nothing(browser):
    before = counts()
    answer = browser.post("/views/", {"name": "a\x00b", "query": "tag=x"})
    assert answer.status_code == 400 and 'data-field="name"' in answer.content.decode()
    assert counts() == before
