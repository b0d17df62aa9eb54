"""The API's OpenAPI 3 document, built by drf-spectacular (runs.api.schema): valid by the OpenAPI
specification's own validator, as served to a token's holder, and its page behind the login."""
from __future__ import annotations

import copy

import pytest
from django.test import Client
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError


def test_the_served_document_is_valid_openapi_3(api):
    schema = api("viewer").get("/api/v1/openapi.json").json()
    assert schema["openapi"].startswith("3.0.")
    validate(schema)  # raises on any departure from the OpenAPI 3.0 specification
    # The validator is not a formality: an operation answering nothing is refused.
    broken = copy.deepcopy(schema)
    broken["paths"]["/api/v1/runs/"]["get"]["responses"] = "none"
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_each_path_parameter_has_its_own_type_and_name(api):
    schema = api("viewer").get("/api/v1/openapi.json").json()
    member = schema["paths"]["/api/v1/projects/{id}/members/{username}/"]["delete"]["parameters"]
    assert [(p["name"], p["schema"]["type"], p["description"]) for p in member if p["in"] == "path"] == [
        ("id", "integer", "the project's id"), ("username", "string", "the member's username")]


def test_the_api_page_needs_a_login_and_names_bodies_without_a_type(people):
    assert Client().get("/api/v1/").status_code == 302
    browser = Client()
    browser.force_login(people["viewer"][0])
    html = browser.get("/api/v1/").content.decode()
    # PointsBody's points is any JSON (a list of objects), which the schema leaves untyped.
    assert "<code>points</code>" in html and "any JSON" in html
