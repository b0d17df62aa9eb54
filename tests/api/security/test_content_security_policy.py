"""The Content-Security-Policy (eagle3web.security, settings.CONTENT_SECURITY_POLICY): deployed (DJANGO_DEBUG=0)
the settings hold it with every directive, and pages, the login redirect and API answers carry it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

DIRECTIVES = ["default-src 'self'", "script-src 'self' 'unsafe-eval'", "style-src 'self'", "img-src 'self' data:",
              "object-src 'none'", "base-uri 'self'", "frame-ancestors 'none'", "form-action 'self'"]


def test_deployed_settings_hold_the_policy_with_every_directive():
    env = {**os.environ, "DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "csp-test-key-" + "x" * 40,
           "DJANGO_SETTINGS_MODULE": "eagle3web.settings"}
    policy = subprocess.run([sys.executable, "-c", "from django.conf import settings; "
                             "print(settings.CONTENT_SECURITY_POLICY)"],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert sorted(policy.split("; ")) == sorted(DIRECTIVES)
    assert "'unsafe-inline'" not in policy


@pytest.mark.django_db
def test_pages_redirects_and_api_answers_carry_the_policy(client, user, settings):
    settings.CONTENT_SECURITY_POLICY = "; ".join(DIRECTIVES)
    assert client.get("/").headers["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY  # to the login
    client.force_login(user)
    for url in ("/", "/sweeps/", "/api/v1/me/"):
        answer = client.get(url)
        assert answer.status_code == 200 and answer.headers["Content-Security-Policy"] == "; ".join(DIRECTIVES), url


@pytest.mark.django_db
def test_no_policy_is_sent_when_the_setting_is_empty(client, user, settings):
    settings.CONTENT_SECURITY_POLICY = ""  # DJANGO_DEBUG=1: Django's error pages are inline script and style
    client.force_login(user)
    assert "Content-Security-Policy" not in client.get("/").headers
