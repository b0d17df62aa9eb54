"""Where a webhook may go, and posting to it.

A webhook URL is a request the server makes on a user's behalf, so it could reach what only the server
can (a metadata service, the database's host, an admin page on localhost). Its host must be listed in
EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS, and every address the name resolves to must be public, unless that
address (or a network holding it) is listed too: a listed name that resolves to 10.0.0.5 tomorrow is
refused, not followed. The POST then connects to the very address checked (no second resolution that
could answer otherwise) and follows no redirect."""
from __future__ import annotations

import http.client
import ipaddress
import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

TIMEOUT_SECONDS = 10


class WebhookRefused(ValueError):
    """The URL may not be posted to; the message says why."""


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked address the POST connects to


def _allowed() -> tuple[set[str], list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    names, networks = set(), []
    for entry in settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS:
        entry = entry.strip().lower().strip("[]")
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.add(entry)
    return names, networks


def _internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return (address.is_loopback or address.is_private or address.is_link_local or address.is_reserved
            or address.is_multicast or address.is_unspecified or not address.is_global)


def webhook_check(url: str) -> Destination:
    """The URL's destination, or WebhookRefused naming what is wrong with it."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise WebhookRefused(f"the webhook URL must start with http:// or https://, not {parts.scheme[:20]!r}")
    if parts.username or parts.password:
        raise WebhookRefused("the webhook URL may not carry a user name or password")
    host = (parts.hostname or "").lower()
    if not host:
        raise WebhookRefused("the webhook URL names no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookRefused("the webhook URL's port is not a number from 0 to 65535") from None
    names, networks = _allowed()
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    listed = host in names or (literal is not None and any(literal in n for n in networks))
    if not listed:
        shown = ", ".join(settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS) or "none"
        raise WebhookRefused(f"webhook host {host[:100]!r} is not in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS (allowed: {shown})")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise WebhookRefused(f"webhook host {host[:100]!r} does not resolve: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
    for address in addresses:
        if _internal(address) and not any(address in n for n in networks):
            raise WebhookRefused(
                f"webhook host {host[:100]!r} resolves to {address}, a loopback, private or link-local address; "
                f"list {address} in EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS to allow it")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(scheme=parts.scheme, host=host, port=port, path=path, address=str(addresses[0]))


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, destination: Destination):
        super().__init__(destination.host, destination.port, timeout=TIMEOUT_SECONDS)
        self.address = destination.address

    def connect(self):
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, destination: Destination):
        super().__init__(destination.host, destination.port, timeout=TIMEOUT_SECONDS)
        self.address = destination.address

    def connect(self):
        # The certificate is checked against the host name, over a connection to the checked address.
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def webhook_post(url: str, text: str) -> None:
    """POST {"text": text} (what Slack's incoming webhooks read); raises WebhookRefused for a destination
    that is not allowed, OSError or WebhookFailed for one that did not take it."""
    destination = webhook_check(url)
    connection = (_PinnedHTTPS if destination.scheme == "https" else _PinnedHTTP)(destination)
    body = json.dumps({"text": text}).encode()
    try:
        connection.request("POST", destination.path, body=body,
                           headers={"Content-Type": "application/json", "User-Agent": "eagle3web-alerts"})
        response = connection.getresponse()
        answer = response.read(2000).decode("utf-8", "replace")
    finally:
        connection.close()
    if not 200 <= response.status < 300:
        raise WebhookFailed(f"the webhook answered HTTP {response.status}: {answer[:300]}")


class WebhookFailed(RuntimeError):
    """The webhook answered, but not with a 2xx."""
