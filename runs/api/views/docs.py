"""The API's description: /api/v1/openapi.json (OpenAPI 3, built by drf-spectacular in runs.api.schema)
and /api/v1/, a page that lists every path, method, parameter, body field and answer from that
document, rendered here (closed clusters reach no CDN for a Swagger UI). Anything else under /api/v1/
is a JSON 404."""
from __future__ import annotations

import re

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve
from rest_framework.response import Response

from runs.api.base import ApiView
from runs.api.schema import api_schema


class OpenApiJson(ApiView):
    schema = None  # not an operation of the API it describes

    def get(self, request):
        return Response(api_schema())


openapi_json = OpenApiJson.as_view()


def _body_fields(schema: dict, operation: dict) -> list[dict]:
    """The body's fields; of a body that is one of several (POST /runs/: a launch or a run trained
    elsewhere), each alternative's after the first's, its fields' descriptions naming it."""
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    rows = []
    for index, alternative in enumerate(body.get("oneOf") or [body]):
        ref = alternative.get("$ref", "")
        name_of = ref.rsplit("/", 1)[-1]
        component = schema.get("components", {}).get("schemas", {}).get(name_of, {}) if ref else alternative
        required = set(component.get("required", []))
        for name, spec in component.get("properties", {}).items():
            kind = spec.get("type", "any JSON")  # a JSONField: no type in the schema
            if kind == "array":
                kind = f"list of {spec.get('items', {}).get('type', 'values')}"
            description = spec.get("description", "")
            rows.append({"name": name, "type": kind + (" or null" if spec.get("nullable") else ""),
                         "required": name in required,
                         "description": f"({name_of} instead) {description}" if index else description})
    return rows


def api_docs(request: HttpRequest) -> HttpResponse:
    """The API's reference, from the same document a client reads."""
    schema = api_schema()
    operations = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            operations.append({
                "path": path, "method": method.upper(), "summary": operation.get("summary", ""),
                "description": operation.get("description", ""), "tag": (operation.get("tags") or [""])[0],
                "parameters": operation.get("parameters", []), "body": _body_fields(schema, operation),
                "responses": sorted((code, answer.get("description", "")) for code, answer in
                                    operation.get("responses", {}).items()),
                "anchor": re.sub(r"[^a-z0-9]+", "-", f"{method}-{path}".lower()).strip("-"),  # post-api-v1-runs
            })
    return render(request, "api/docs.html", {"schema": schema, "operations": operations})


class NotFound(ApiView):
    schema = None

    def _missing(self, request, *args, **kwargs):
        path = request.path
        hint = ""
        if not path.endswith("/"):
            try:
                if resolve(path + "/").url_name != "not_found":
                    hint = f" (did you mean {path}/, with the slash?)"
            except Resolver404:
                pass
        raise Http404(f"nothing at {path}{hint}; the endpoints are listed at /api/v1/openapi.json")

    get = post = put = patch = delete = _missing


not_found = NotFound.as_view()
