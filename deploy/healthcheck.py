"""Container health check for the web service: GET /login/ (anonymous, no database write) from
inside the container. Exit 0 when the app answers it, 1 otherwise.

It names the first of DJANGO_ALLOWED_HOSTS as Host (Django refuses others) and says the request
came over HTTPS, which Django believes only with DJANGO_BEHIND_TLS_PROXY=1; without a trusted
proxy, Django's own redirect to https://…/login/ also counts as an answer.
Usage: python deploy/healthcheck.py [PORT]   (default: $PORT or 8000)
"""
from __future__ import annotations

import http.client
import os
import sys


def _host() -> str:
    hosts = [h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",") if h.strip()]
    host = hosts[0] if hosts else "localhost"
    if host == "*":
        return "localhost"
    return host.lstrip(".")  # ".example.com" allows example.com and its subdomains


def check(port: int, timeout: float = 5.0) -> tuple[bool, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/login/", headers={"Host": _host(), "X-Forwarded-Proto": "https"})
        response = conn.getresponse()
        location = response.getheader("Location") or ""
    except OSError as exc:
        return False, f"no answer on port {port}: {exc}"
    finally:
        conn.close()
    if response.status == 200:
        return True, "200 /login/"
    if response.status in (301, 302) and location.startswith("https://"):
        return True, f"{response.status} to {location}"
    return False, f"{response.status} /login/ {location}".strip()


if __name__ == "__main__":
    port = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PORT", "8000"))
    ok, message = check(port)
    print(message)
    sys.exit(0 if ok else 1)
