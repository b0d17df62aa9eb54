"""Where a URL a user names may send this server's requests: one rule for alert webhooks and capture servers.

A URL a user names is a request the server (or a worker) makes on their behalf, so it could reach what only
the server can: a metadata service, the database's host, an admin page on localhost. Its host must be listed
in the operator's setting (EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS, EAGLE3WEB_CAPTURE_ALLOWED_HOSTS: names,
addresses or networks), and every address the name resolves to must be public unless that address (or a
network holding it) is listed too: a listed name that resolves to 10.0.0.5 tomorrow is refused, not
followed. Odd spellings of an address that resolvers accept but readers miss (2130706433, 0x7f.1, 0177.0.0.1,
127.1: all 127.0.0.1), a user name or password, and `.`/`..` path segments are refused. The request then
connects to the very address checked (no second resolution that could answer otherwise: no DNS rebinding)
and follows no redirect (http.client follows none).

Django-free (workers.contract): the web tier passes its setting's list in, and so does a worker's task.
"""
from __future__ import annotations

import http.client
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")


class HostRefused(ValueError):
    """The URL may not be requested; the message says why."""


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str  # as named (lower case): the Host header and the TLS name
    port: int
    path: str  # the URL's path (and query), "" for none
    address: str  # the checked address every request connects to

    @property
    def base(self) -> str:
        """The URL as checked, for messages: scheme://host:port plus its path."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def excerpt(text: object, limit: int = 200) -> str:
    """At most `limit` characters of what a remote server said, quoted with every control or non-ASCII
    character escaped (ascii()), so an answer cannot forge lines, markup or more than a glimpse of itself."""
    text = str(text)
    shown = ascii(text[:limit])
    return shown + (f" (+{len(text) - limit} characters)" if len(text) > limit else "")


def _allowed(entries: Sequence[str]) -> tuple[set[str], list[Network]]:
    names, networks = set(), []
    for entry in entries:
        entry = entry.strip().lower().strip("[]")
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.add(entry.rstrip("."))
    return names, networks


def internal(address: Address) -> bool:
    """Loopback, private, link-local (the metadata service's 169.254.169.254), reserved, multicast or
    otherwise not global: what a user's URL may reach only when the operator lists it."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return (address.is_loopback or address.is_private or address.is_link_local or address.is_reserved
            or address.is_multicast or address.is_unspecified or not address.is_global)


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _host_spelling(host: str, what: str) -> str | None:
    """Why `host` is not a plain address or DNS name, or None: an address written as one number, in octal or
    hex, or with parts left out, is read by the resolver as another address than a reader sees."""
    if _literal(host) is not None:
        return None
    labels = host.rstrip(".").split(".")
    if any(_NUMERIC_LABEL.match(label) for label in labels) and all(
            _NUMERIC_LABEL.match(label) for label in labels):
        return f"{what} host {host[:100]!r} is an address in an unusual spelling: write it as a.b.c.d"
    if len(host) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        return f"{what} host {host[:100]!r} is not a host name or IP address"
    return None


def check_url(url: str, *, allowed: Sequence[str], setting: str, what: str) -> Destination:
    """The URL's destination (its address resolved once, to connect to), or HostRefused saying what is wrong
    with it, in words that start with `what` ("webhook", "capture server") and name `setting`."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise HostRefused(f"the {what} URL must start with http:// or https://, not {parts.scheme[:20]!r}")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise HostRefused(f"the {what} URL may not carry a user name or password")
    host = (parts.hostname or "").lower()
    if not host:
        raise HostRefused(f"the {what} URL names no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise HostRefused(f"the {what} URL's port is not a number from 0 to 65535") from None
    if (why := _host_spelling(host, what)) is not None:
        raise HostRefused(why)
    segments = unquote(parts.path).replace("\\", "/").split("/")
    if any(segment in (".", "..") for segment in segments):
        raise HostRefused(f"the {what} URL's path may not hold '.' or '..' segments")
    names, networks = _allowed(allowed)
    literal = _literal(host)
    listed = host.rstrip(".") in names or (literal is not None and any(literal in n for n in networks))
    if not listed:
        shown = ", ".join(allowed) or "none"
        raise HostRefused(f"{what} host {host[:100]!r} is not in {setting} (allowed: {shown})")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise HostRefused(f"{what} host {host[:100]!r} does not resolve: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
    for address in addresses:
        if internal(address) and not any(address in n for n in networks):
            raise HostRefused(
                f"{what} host {host[:100]!r} resolves to {address}, a loopback, private or link-local address; "
                f"list {address} in {setting} to allow it")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return Destination(scheme=parts.scheme, host=host, port=port, path=path, address=str(addresses[0]))


def loopback(port: int) -> Destination:
    """A server this worker started itself, on its own loopback (trusted: no list to pass)."""
    return Destination(scheme="http", host="127.0.0.1", port=port, path="", address="127.0.0.1")


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, destination: Destination, timeout: float):
        super().__init__(destination.host, destination.port, timeout=timeout)
        self.address = destination.address

    def connect(self):
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, destination: Destination, timeout: float):
        super().__init__(destination.host, destination.port, timeout=timeout)
        self.address = destination.address

    def connect(self):
        # The certificate is checked against the host name, over a connection to the checked address.
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def pinned_request(destination: Destination, method: str, path: str, *, body: bytes | None = None,
                   headers: dict[str, str] | None = None, timeout: float, limit: int) -> tuple[int, bytes, bool]:
    """(status, at most `limit` bytes of the body, whether that was all of it) of one request to the checked
    address; no redirect is followed (a 3xx is returned as it is)."""
    connection = (_PinnedHTTPS if destination.scheme == "https" else _PinnedHTTP)(destination, timeout)
    try:
        connection.request(method, (destination.path + path) or "/", body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read(limit + 1)
    finally:
        connection.close()
    return response.status, data[:limit], len(data) <= limit
