"""Every route of the URL map, walked as tests/views/url_map/test_authorization_matrix.py walks it (a route added
later is covered with no change here), refuses text PostgreSQL cannot store with a 400 naming the field: in each
query parameter the route reads, in each field of its form or JSON body (keys and values at any depth), and in
its path. Never a 500, nothing stored; the API answers in its JSON, the pages with the page
(eagle3web/storable_text.py).

Asked as the admin, the role that reaches furthest into every view."""
from __future__ import annotations

import json
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import pytest
from django.urls import Resolver404, resolve
from rest_framework.views import APIView

from runs.tracking.runs_list import run_filters
from tests.views.url_map.test_authorization_matrix import ROUTES, World, entry_for, fingerprint

pytestmark = pytest.mark.django_db

NUL, SURROGATE = "\x00", "\ud800"
# Besides those a route declares or its sample URL carries: the runs list's filters (the 500s), which
# any page may be asked with.
FILTERS = tuple(name for name in run_filters.PARAMS if name != "page")


@pytest.fixture
def world(tmp_path, config_only_target):
    return World(tmp_path, config_only_target)


def routes(world):
    for route in ROUTES:
        entry = entry_for(route, world)
        assert entry is not None, f"{route!r} has no entry in the authorization matrix"
        yield route, entry, entry.url.format(**world.ids())


def query_names(url: str) -> list[str]:
    """The route's sample parameters, those its API view declares (its OpenAPI `query_params`), the filters."""
    path, query = url.split("?")[0], urlsplit(url).query
    view = getattr(resolve(path).func, "view_class", None)
    declared = [name for name, *_ in getattr(view, "query_params", {}).get("GET", [])]
    return list(dict.fromkeys([name for name, _ in parse_qsl(query)] + declared + list(FILTERS)))


def refused(response, field: str, *, api: bool) -> str | None:
    """Why `response` is not a 400 naming `field` in the answer's own language, or None."""
    if response.status_code != 400:
        return f"answered {response.status_code}"
    if api:
        if response["Content-Type"] != "application/json" or set(response.json()) != {"error", "fields"}:
            return f"not the API's JSON: {response.content[:200]!r}"
        if list(response.json()["fields"]) != [field]:
            return f"named {list(response.json()['fields'])}, not {field!r}"
        return None
    page = response.content.decode()
    if not response["Content-Type"].startswith("text/html") or "<h1>Not accepted</h1>" not in page:
        return f"not the refusal page: {page[:200]!r}"
    return None if f'data-field="{field}"' in page else f"the page does not name {field!r}"


def with_bad_text(value, bad: str, where: str = ""):
    """(where, value with `bad` in one string) for each string of a form or body, keys included: where is named
    as the API names it (params.sort, ids[0]); a key is named by the object holding it."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield where, {**{k: v for k, v in value.items() if k != key}, f"{key}{bad}": item}
            for inner, changed in with_bad_text(item, bad, f"{where}.{key}" if where else key):
                yield inner, {**value, key: changed}
    elif isinstance(value, list):
        for index, item in enumerate(value):
            for inner, changed in with_bad_text(item, bad, f"{where}[{index}]"):
                yield inner, [*value[:index], changed, *value[index + 1:]]
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield where, f"{value}{bad}"


def path_answer(bad_url: str) -> tuple[str, bool]:
    """The field the refusal names (the route's capture holding the bad text, else `path`) and whether the
    route it reaches is the API's (a bad segment under a page of the API's, its docs, reaches the API's 404)."""
    try:
        match = resolve(unquote(bad_url))
    except Resolver404:
        return "path", bad_url.startswith("/api/")
    field = next((name for name, value in match.kwargs.items() if isinstance(value, str) and NUL in value), "path")
    return field, issubclass(getattr(match.func, "cls", object), APIView)


def test_a_nul_in_any_query_parameter_of_any_route_is_a_400_naming_it(world):
    failures, admin, script = [], world.client("admin"), world.api_client("admin")
    for route, entry, url in routes(world):
        path, query = url.split("?")[0], dict(parse_qsl(urlsplit(url).query))
        for name in query_names(url):
            response = (script if entry.api else admin).get(path, {**query, name: f"run{NUL}1"})
            if why := refused(response, name, api=entry.api):
                failures.append(f"GET {path}?{name}=<NUL> ({route}): {why}")
    assert failures == [], "\n".join(failures)


def test_a_nul_in_any_path_is_a_400_naming_the_capture_or_the_path(world):
    failures, admin, script = [], world.client("admin"), world.api_client("admin")
    for route, entry, url in routes(world):
        path = url.split("?")[0]
        texts = [value for value in resolve(path).kwargs.values() if isinstance(value, str)]
        asked = [path.replace(quote(value, safe="/"), f"a{quote(NUL)}b", 1) for value in texts]
        for bad_url in [*asked, path + quote(NUL) + "/"]:
            field, api = path_answer(bad_url)
            for method in ("GET", "POST", "DELETE"):
                response = (script if entry.api else admin).generic(method, bad_url)
                if why := refused(response, field, api=api):
                    failures.append(f"{method} {bad_url!r} ({route}): {why}")
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
def test_unstorable_text_in_any_field_of_any_form_or_body_is_a_400_naming_it_and_stores_nothing(world, bad):
    """Forms cannot carry a surrogate (Django decodes a form's bytes as UTF-8, replacing what is not): JSON can."""
    failures, admin, script = [], world.client("admin"), world.api_client("admin")
    before = fingerprint()
    for route, entry, url in routes(world):
        if entry.post is None or (bad == SURROGATE and not entry.api):
            continue
        data = getattr(world, entry.data)() if entry.data else {"note": "text"}
        for where, changed in with_bad_text(data, bad):
            # A form names its field (a bad key: the key itself); the API where in the body it sits.
            field = (where or "body") if entry.api else next(
                k for k, v in changed.items() if any(bad in str(t) for t in [k, *(v if isinstance(v, list) else [v])]))
            if entry.api:
                response = script.post(url, json.dumps(changed), content_type="application/json")
            else:
                response = admin.post(url, changed)
            if why := refused(response, field.replace(bad, "\\x00"), api=entry.api):
                failures.append(f"POST {url} with {bad!r} in {field!r} ({route}): {why}")
    assert fingerprint() == before, "a refused request changed the database"
    assert failures == [], "\n".join(failures)
