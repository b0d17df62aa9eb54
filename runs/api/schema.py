"""The OpenAPI 3 description of the API, built by drf-spectacular: each view says, per method, its
JSON body (a serializer), its query and header parameters and its answers; errors share one shape.
The views declare these as plain class attributes (runs.api.base.ApiView), read here."""
from __future__ import annotations

import inspect

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from uritemplate import variables as path_variables

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
    """One operation per view and method, from what the view declares (not from a queryset or a
    model: these views call services and selectors)."""

    def _declared(self, name: str, method: str, default):
        return (getattr(self.view, name, None) or {}).get(method, default)

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        self.registry, self.path, self.path_regex, self.path_prefix = registry, path, path_regex, path_prefix
        self.method = method.upper()
        view = self.view
        handler = getattr(view, method.lower(), None)
        doc = inspect.getdoc(handler) or inspect.getdoc(view) or ""
        summary, _, description = doc.partition("\n\n")
        operation = {
            "operationId": f"{method.lower()}_{view.__class__.__name__}",
            "summary": " ".join(summary.split()),
            "description": description.strip(),
            "tags": self.get_tags(),
            "parameters": (self._path_parameters() + self._query_parameters(self.method)
                           + self._header_parameters(self.method)),
        }
        request_body = self._request_body(self.method)
        if request_body:
            operation["requestBody"] = request_body
        operation["responses"] = self._responses(self.method)
        return operation

    def get_tags(self):
        parts = self.path.strip("/").split("/")
        return [parts[2] if parts[:2] == ["api", "v1"] and len(parts) > 2 else parts[0]]  # runs, datasets, ...

    def _path_parameters(self):
        # Each variable is named by the segment before it: /projects/{id}/members/{username}/ takes the
        # project's id and the member's username (a string, as its URL converter says).
        def noun(name):
            return self.path.split("{" + name + "}")[0].rstrip("/").rsplit("/", 1)[-1].removesuffix("s")

        return [{"name": name, "in": "path", "required": True,
                 "schema": {"type": "string" if name == "username" else "integer"},
                 "description": f"the {noun(name)}'s {name}"}
                for name in path_variables(self.path)]

    def _query_parameters(self, method):
        # (name, type, description) or (name, type, description, allowed values): an enum (a run's status).
        return [{"name": name, "in": "query", "required": False,
                 "schema": {"type": kind, **({"enum": list(rest[0])} if rest else {})}, "description": text}
                for name, kind, text, *rest in self._declared("query_params", method, [])]

    def _header_parameters(self, method):
        # `header_params` as `query_params`: (name, type, description), none of them required.
        return [{"name": name, "in": "header", "required": False, "schema": {"type": kind}, "description": text}
                for name, kind, text in self._declared("header_params", method, [])]

    def _bodies(self, method) -> list:
        """The method's bodies: its own, then those of its branches ("POST external": RunList's other body)."""
        declared = getattr(self.view, "request_serializers", None) or {}
        return [cls() for key, cls in declared.items() if key == method or key.startswith(f"{method} ")]

    def get_serializer_name(self, serializer, direction):
        return serializer.__class__.__name__.removesuffix("Serializer") + "Body"  # LaunchSerializer: LaunchBody

    def _body_ref(self, serializer) -> dict:
        # As resolve_serializer, except that a body with no fields (EmptyBody: a cancel takes {}) is
        # kept as a component too: the client still sends a JSON object.
        component = ResolvedComponent(name=self._get_serializer_name(serializer, "request"),
                                      type=ResolvedComponent.SCHEMA, object=serializer.__class__)
        if component not in self.registry:
            component.schema = self._map_serializer(serializer, "request")
            if "required" in component.schema:  # in the fields' order, as a reader meets them, not sorted
                order = list(serializer.fields)
                component.schema["required"].sort(key=order.index)
            self.registry.register(component)
        return component.ref

    def _request_body(self, method):
        refs = [self._body_ref(body) for body in self._bodies(method)]
        if not refs:
            return {}
        schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    def _error_ref(self) -> dict:
        component = ResolvedComponent(name="Error", type=ResolvedComponent.SCHEMA, object="Error", schema=ERROR)
        self.registry.register_on_missing(component)
        return component.ref

    def _responses(self, method):
        declared = self._declared("responses", method, None) or {"200": "the object as JSON"}
        # A declared refusal (a 409) has the error shape; a declared success, the object it describes.
        answers = {code: {"description": text, "content": {"application/json": {"schema": (
            self._error_ref() if code.startswith("4") else {"type": "object"})}}}
            for code, text in declared.items()}
        wanted = ["401", "403", "404", "429"] if "{" in self.path else ["401", "403", "429"]
        if method in ("POST", "PUT", "PATCH") or self._declared("query_params", method, None):
            wanted.insert(0, "400")
        for code in wanted:
            answers.setdefault(code, {"description": ERRORS[code], "content": {
                "application/json": {"schema": self._error_ref()}}})
        return answers


def api_schema() -> dict:
    """The whole API's OpenAPI document, the same for every caller (no view is left out by role).
    drf-spectacular's generator walks the site's URL map for REST framework views (those of
    runs.api.urls); title, version and description are SPECTACULAR_SETTINGS' (eagle3web.settings)."""
    return SchemaGenerator().get_schema(request=None, public=True)
