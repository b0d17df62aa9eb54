"""What every view of the API shares, on Django REST framework: bearer tokens (and the browser's
session), JSON in and out whatever the Accept header says, every error as
{"error": "...", "fields": {...}}, the audit trail, and the page-numbered lists."""
from __future__ import annotations

import logging
import math
import re

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.core.paginator import EmptyPage, Paginator
from django.db import transaction
from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from runs.api import tokens
from runs.api.bodies.parsers import LimitedJSONParser
from runs.api.schema import ApiSchema
from runs.pipeline.launch.setting_bounds import renamed_setting
from workers.contract.errors import InputError

log = logging.getLogger(__name__)

HEADER_RE = re.compile(r"Bearer ([A-Za-z0-9_\-]{1,200})")
MAX_PAGE = 10**6
MAX_ID = 2**63 - 1


def client_address(request) -> str:
    # REMOTE_ADDR, not X-Forwarded-For: a header a client sets itself would let it pick its own bucket.
    # Behind a proxy every client shares the proxy's address (docs/api/index.md).
    return request.META.get("REMOTE_ADDR", "") or "unknown"


class ApiInputError(InputError):
    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class AuthRateLimited(exceptions.APIException):
    """429 in our own words (DRF's Throttled appends its "Expected available in N seconds."; a DRF throttle's
    own 429 is reworded by api_exception_handler, throttled_message)."""
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = "too many failed authentications from this address"

    def __init__(self, *, wait: int, detail: str):
        super().__init__(detail)
        self.wait = wait


def throttled_message(wait: int | None) -> str:
    """A DRF throttle's 429 in our words (its own Throttled says "Request was throttled. Expected available
    in N seconds."); the seconds go in Retry-After as well."""
    return f"too many requests from this client; try again {f'in {int(wait)} s' if wait else 'later'}"


class BearerTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer e3w_...`: the token's user, with the user's role. No header: the next
    way (the browser's session) is tried. A bad header or token is counted against the client."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        client = client_address(request._request)
        wait = tokens.auth_blocked_for(client=client)
        if wait:
            raise AuthRateLimited(wait=wait, detail=(
                f"too many failed authentications from {client} this minute (at most "
                f"{tokens.auth_failure_limit()}); try again in {wait} s with a valid token"))
        match = HEADER_RE.fullmatch(header.strip())
        if match is None:
            tokens.auth_failure_record(client=client)
            raise exceptions.AuthenticationFailed(
                "malformed Authorization header: send 'Authorization: Bearer <token>' with the token as made "
                "on /account/ or by manage.py create_api_token")
        try:
            token = tokens.token_authenticate(secret=match[1])
        except tokens.TokenRefused as exc:
            tokens.auth_failure_record(client=client)
            log.warning("API authentication refused from %s: %s", client, exc)
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return token.user, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="eagle3web"'


def _finite(value):
    """NaN and infinities as the strings "nan", "inf", "-inf" (JSON has no literal for them; a loss that
    diverged is still said), as the curves export writes them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class StrictJsonRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        return super().render(_finite(data), accepted_media_type, renderer_context)


class JsonOnly(DefaultContentNegotiation):
    """Every answer is JSON, whatever the client accepts: a script never gets an HTML page. (A body
    that is not JSON is still refused by its Content-Type, 415.)"""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def _flat(detail) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flat(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return " ".join(_flat(v) for v in detail)
    return str(detail)


def error_response(message: str, *, code: int, fields: dict | None = None, headers: dict | None = None) -> Response:
    return Response({"error": message, "fields": fields or {}}, status=code, headers=headers)


def api_exception_handler(exc, context):
    """{"error": "...", "fields": {"<field>": "..."}} for every refusal; a field is named as in the request."""
    view = context.get("view")
    renames = getattr(view, "field_names", {}) or {}
    headers = {}
    if isinstance(exc, Http404):
        message = str(exc)
        if not message or message.endswith("matches the given query."):  # get_object_or_404's words
            message = f"nothing at {context['request'].path}"
        return error_response(message, code=404)
    if isinstance(exc, RequestDataTooBig):
        # Django refused to read a body past DATA_UPLOAD_MAX_MEMORY_SIZE (eagle3web/settings.py).
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return error_response(f"the body is larger than {limit:,} bytes, the most accepted; send metric points in "
                              "batches of at most 10,000", code=413)
    if isinstance(exc, InputError):
        field = getattr(exc, "field", None)
        field = renames.get(field, field)
        set_rollback()
        return error_response(str(exc), code=400, fields={field: str(exc)} if field else {})
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        fields = {renames.get(k, k): _flat(v) for k, v in detail.items() if k != "non_field_errors"}
        message = _flat(detail.get("non_field_errors", "")) or "; ".join(f"{k}: {v}" for k, v in fields.items())
        return error_response(message or "bad input", code=400, fields=fields)
    from django.core.exceptions import PermissionDenied

    if isinstance(exc, PermissionDenied):
        return error_response(str(exc) or "you may not do this", code=403)
    if isinstance(exc, exceptions.APIException):
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        message = _flat(exc.detail)
        if isinstance(exc, exceptions.Throttled):
            message = throttled_message(exc.wait)
        elif isinstance(exc, exceptions.NotAuthenticated):
            message = ("authentication required: send 'Authorization: Bearer <token>' (make one on /account/ "
                       "or with manage.py create_api_token)")
        elif isinstance(exc, exceptions.MethodNotAllowed):
            allowed = ", ".join(m for m in view.allowed_methods if m not in ("OPTIONS", "HEAD")) if view else ""
            message = f"{context['request'].method} is not allowed here; allowed: {allowed}"
        return error_response(message, code=exc.status_code, headers=headers)
    log.exception("API request failed", exc_info=exc)
    set_rollback()
    return error_response("the server failed on this request; its log has the details", code=500)


class ApiView(APIView):
    """Base of every API view. Subclasses name the JSON body's serializer per method
    (`request_serializers`), their query parameters (`query_params`) and answers (`responses`) for
    the OpenAPI schema; `field_names` renames a service's field (target_path) to the body's (target)."""

    authentication_classes = [BearerTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    renderer_classes = [StrictJsonRenderer]
    parser_classes = [LimitedJSONParser]
    content_negotiation_class = JsonOnly
    throttle_classes = []
    schema = ApiSchema()
    request_serializers: dict = {}
    query_params: dict = {}
    responses: dict = {}
    field_names: dict = {}

    @classmethod
    def as_view(cls, **initkwargs):
        # Anonymous requests get a 401 in JSON from the view, not the site's redirect to its login page.
        return login_not_required(super().as_view(**initkwargs))

    def get_exception_handler(self):
        return api_exception_handler

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        json_body = request.content_type.partition(";")[0].strip().lower() == "application/json"
        if json_body and request.META.get("CONTENT_LENGTH", "0") not in ("", "0"):
            # Every JSON body is parsed before the view acts, where the view takes no field from it too (a
            # cancel): one that is not JSON, nests too deep or holds text PostgreSQL cannot store is a 400
            # (runs.api.bodies.parsers), never ignored.
            request.data  # noqa: B018
        # Ids are 64-bit columns: a larger one names nothing (PostgreSQL would refuse to compare it).
        for name, value in kwargs.items():
            if isinstance(value, int) and value > MAX_ID:
                raise Http404(f"no {name} {value}")

    def body(self, method: str | None = None) -> dict:
        """The request's JSON body checked by the method's serializer: unknown fields are refused, so a
        misspelt option is never silently left at its default."""
        serializer_class = self.request_serializers[method or self.request.method]
        data = self.request.data
        if not isinstance(data, dict):
            raise exceptions.ValidationError({"non_field_errors": [
                f"the body must be a JSON object, got {type(data).__name__}"]})
        unknown = sorted(set(data) - set(serializer_class().fields))
        if renamed := {name: [why] for name in unknown if (why := renamed_setting(name))}:
            raise exceptions.ValidationError(renamed)
        if unknown:
            raise exceptions.ValidationError({name: [f"unknown field {name[:40]!r} (known: "
                                                     f"{', '.join(serializer_class().fields)})"]
                                              for name in unknown[:5]})
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return {k: v for k, v in serializer.validated_data.items()}

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        self._audit(request, response)
        return response

    def _audit(self, request, response) -> None:
        """Every request a token made, and every write a browser session made, with its user."""
        user = getattr(request, "_user", None)
        token = request.auth if isinstance(getattr(request, "_auth", None), tokens.ApiToken) else None
        if user is None or not user.is_authenticated:
            return
        if token is None and request.method in ("GET", "HEAD", "OPTIONS"):
            return
        try:
            with transaction.atomic():
                tokens.audit_record(user=user, token=token, method=request.method, path=request.get_full_path(),
                                    status=response.status_code, client=client_address(request._request))
        except Exception:  # the answer stands; a lost audit row is logged loudly
            log.exception("API audit entry not recorded: %s %s by %s", request.method, request.path, user)


def page_number(request) -> int:
    text = request.query_params.get("page", "1") or "1"
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_PAGE:
        raise ApiInputError(f"page must be a number from 1, got {text[:20]!r}", field="page")
    return int(text)


def paged(request, *, items, total: int, page: int, pages: int, page_size: int) -> dict:
    """A list's answer: the page's items and where the others are."""
    def link(number: int) -> str:
        query = request.query_params.copy()
        query["page"] = str(number)
        return request.build_absolute_uri(request.path + "?" + query.urlencode())

    return {"count": total, "page": page, "pages": pages, "page_size": page_size,
            "next": link(page + 1) if page < pages else None,
            "previous": link(page - 1) if page > 1 else None, "results": items}


def paginate(request, queryset, *, page_size: int, shape) -> dict:
    """A queryset's page (`?page=N`, from 1) as `paged` answers it, each row through `shape`."""
    number = page_number(request)
    paginator = Paginator(queryset, page_size)
    try:
        page = paginator.page(number)
    except EmptyPage:
        raise ApiInputError(f"page {number} is past the last page ({paginator.num_pages})", field="page") from None
    return paged(request, items=[shape(row) for row in page.object_list], total=paginator.count, page=number,
                 pages=paginator.num_pages, page_size=page_size)


def created(data: dict) -> Response:
    return Response(data, status=status.HTTP_201_CREATED)


def accepted(data: dict) -> Response:
    return Response(data, status=status.HTTP_202_ACCEPTED)


def server_error(request):
    """Django's last resort (urls.handler500: an error no view's handler caught, e.g. while rendering its
    answer) answers the API in JSON too, so a script never reads the site's HTML error page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "the server failed on this request; its log has the details", "fields": {}},
                            status=500)
    return defaults.server_error(request)
