"""The OpenAPI description of the API, from DRF's generator: each view says, per method, its JSON
body (a serializer), its query parameters and its answers; errors share one shape."""
from __future__ import annotations

import inspect

from rest_framework.schemas.openapi import AutoSchema, SchemaGenerator
from rest_framework import serializers

ERROR = {
    "type": "object",
    "required": ["error", "fields"],
    "properties": {
        "error": {"type": "string", "description": "what went wrong and what to do next"},
        "fields": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "the request's fields to blame, each with its message (empty when none)"},
    },
}
ERRORS = {
    "400": "bad input: `error` says why, `fields` names the request's fields to blame; nothing was stored",
    "401": "no token, a malformed Authorization header, or an unknown, revoked or deactivated user's token",
    "403": "the token's user lacks the role (or, on a run, is not its owner, an admin or an allowed teammate)",
    "404": "no such object",
    "429": "too many failed authentications from this address in the last minute; see Retry-After",
}


class ApiSchema(AutoSchema):
    def _declared(self, name: str, method: str, default):
        return (getattr(self.view, name, None) or {}).get(method, default)

    def get_operation(self, path, method):
        view = self.view
        handler = getattr(view, method.lower(), None)
        doc = inspect.getdoc(handler) or inspect.getdoc(view) or ""
        summary, _, description = doc.partition("\n\n")
        operation = {
            "operationId": f"{method.lower()}_{view.__class__.__name__}",
            "summary": " ".join(summary.split()),
            "description": description.strip(),
            "tags": self.get_tags(path, method),
            "parameters": (self.get_path_parameters(path, method) + self._query_parameters(method)
                           + self._header_parameters(method)),
        }
        request_body = self.get_request_body(path, method)
        if request_body:
            operation["requestBody"] = request_body
        operation["responses"] = self.get_responses(path, method)
        return operation

    def get_tags(self, path, method):
        parts = path.strip("/").split("/")
        return [parts[2] if parts[:2] == ["api", "v1"] and len(parts) > 2 else parts[0]]  # runs, datasets, ...

    def get_path_parameters(self, path, method):
        from rest_framework.compat import uritemplate

        return [{"name": name, "in": "path", "required": True, "schema": {"type": "integer"},
                 "description": f"the {path.split('{')[0].rstrip('/').split('/')[-1].rstrip('s')}'s id"}
                for name in uritemplate.variables(path)]

    def _query_parameters(self, method):
        # (name, type, description) or (name, type, description, allowed values): an enum (a run's status).
        return [{"name": name, "in": "query", "required": False,
                 "schema": {"type": kind, **({"enum": list(rest[0])} if rest else {})}, "description": text}
                for name, kind, text, *rest in self._declared("query_params", method, [])]

    def _header_parameters(self, method):
        # `header_params` as `query_params`: (name, type, description), none of them required.
        return [{"name": name, "in": "header", "required": False, "schema": {"type": kind}, "description": text}
                for name, kind, text in self._declared("header_params", method, [])]

    def get_request_serializer(self, path, method):
        serializer_class = self._declared("request_serializers", method, None)
        return serializer_class() if serializer_class else None

    def _bodies(self, method) -> list:
        """The method's bodies: its own, then those of its branches ("POST external": RunList's other body)."""
        declared = getattr(self.view, "request_serializers", None) or {}
        return [cls() for key, cls in declared.items() if key == method or key.startswith(f"{method} ")]

    def get_request_body(self, path, method):
        bodies = self._bodies(method)
        if not bodies:
            return {}
        schema = (self.get_reference(bodies[0]) if len(bodies) == 1
                  else {"oneOf": [self.get_reference(body) for body in bodies]})
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    def get_components(self, path, method):
        components = {"Error": ERROR}
        for serializer in self._bodies(method):
            components[self.get_component_name(serializer)] = self.map_serializer(serializer)
        return components

    def get_component_name(self, serializer):
        return serializer.__class__.__name__.removesuffix("Serializer") + "Body"

    def get_responses(self, path, method):
        declared = self._declared("responses", method, None) or {"200": "the object as JSON"}
        # A declared refusal (a 409) has the error shape; a declared success, the object it describes.
        answers = {code: {"description": text, "content": {"application/json": {"schema": (
            {"$ref": "#/components/schemas/Error"} if code.startswith("4") else {"type": "object"})}}}
            for code, text in declared.items()}
        wanted = ["401", "403", "404", "429"] if "{" in path else ["401", "403", "429"]
        if method in ("POST", "PUT", "PATCH") or self._declared("query_params", method, None):
            wanted.insert(0, "400")
        for code in wanted:
            answers.setdefault(code, {"description": ERRORS[code], "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
        return answers


def api_schema() -> dict:
    """The whole API's OpenAPI document, the same for every caller (no view is left out by role). The
    generator walks the site's URL map for REST framework views: those of runs.api.urls."""
    generator = SchemaGenerator(title="eagle3web API", version="1",
                                description="Launch, watch and control EAGLE-3 draft training runs. Send "
                                            "'Authorization: Bearer <token>'; every error is "
                                            "{\"error\": ..., \"fields\": {...}}.")
    return generator.get_schema(request=None, public=True)
