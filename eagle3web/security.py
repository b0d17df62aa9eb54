"""Sends settings.CONTENT_SECURITY_POLICY on every answer (Django 5.2 has no CSP of its own; django-csp
would be a dependency for one header). An answer that set its own policy keeps it; an empty setting
sends none (DJANGO_DEBUG=1, whose error pages are inline HTML, script and style)."""
from __future__ import annotations

from typing import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.CONTENT_SECURITY_POLICY:
            response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        return response
