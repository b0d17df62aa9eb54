"""The capture servers' URLs an online run names (issue 27): each checked the same way for the form, the CLI
and the API, and against the capture host rule."""
from __future__ import annotations

import ipaddress
import unicodedata
from urllib.parse import urlsplit

from runs.pipeline.launch.setting_bounds import MAX_CAPTURE_SERVERS, MAX_CAPTURE_URL_CHARS, RunConfigError
from workers.contract.inputs.host_rule import HostRefused, check_url


# How an error names the i-th URL (1-based): the API's and RunConfig's words; the form and run_pipeline
# pass their own ("URL 2", "--capture-url 2").
URL_NAMED = "capture_urls[{}]"


def check_capture_url(url: object, *, index: int, named: str = URL_NAMED) -> str:
    """A capture server's base URL: http(s)://host[:port], with no user, query or fragment, since the
    train stage appends vLLM's own paths to it, whose host the capture host rule allows. Says which URL
    (1-based) is wrong and why."""
    at = named.format(index + 1)
    if not isinstance(url, str):
        raise RunConfigError(f"{at} must be text, got {type(url).__name__}", field="capture_urls")
    url = url.strip()
    shown = url[:100]
    if len(url) > MAX_CAPTURE_URL_CHARS:
        raise RunConfigError(f"{at} is {len(url)} characters long; at most {MAX_CAPTURE_URL_CHARS}",
                             field="capture_urls")
    if any(unicodedata.category(c) in ("Cc", "Cs", "Zs") for c in url):
        raise RunConfigError(f"{at} {shown!r} may not hold spaces or control characters", field="capture_urls")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise RunConfigError(f"{at} {shown!r} must start with http:// or https://", field="capture_urls")
    if not parts.hostname:
        raise RunConfigError(f"{at} {shown!r} names no host (http://host:port)", field="capture_urls")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise RunConfigError(f"{at} {shown!r} must be a server's base URL: no user, query or fragment",
                             field="capture_urls")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise RunConfigError(f"{at} {shown!r} has no valid port (1 to 65535)", field="capture_urls")
    host = parts.hostname
    if not _host_name_ok(host):
        raise RunConfigError(f"{at} {shown!r}: {host[:60]!r} is not a host name or IP address", field="capture_urls")
    _check_capture_host(url, at=at, shown=shown)
    return url.rstrip("/")


def _check_capture_host(url: str, *, at: str, shown: str) -> None:
    """The capture host rule (workers.contract.inputs.host_rule, as for webhooks): a worker will send this URL GET and
    POST requests, so its host must be in EAGLE3WEB_CAPTURE_ALLOWED_HOSTS and resolve to public addresses
    unless they are listed too. The worker checks again when it uses the URL."""
    from django.conf import settings

    try:
        check_url(url, allowed=settings.EAGLE3WEB_CAPTURE_ALLOWED_HOSTS, setting="EAGLE3WEB_CAPTURE_ALLOWED_HOSTS",
                  what="capture server")
    except HostRefused as exc:
        raise RunConfigError(f"{at} {shown!r}: {exc}", field="capture_urls") from None


def _host_name_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(
        0 < len(label) <= 63 and label[0] != "-" and label[-1] != "-"
        and all(c.isascii() and (c.isalnum() or c == "-") for c in label) for label in labels)


def check_capture_urls(urls: object, *, named: str = URL_NAMED) -> list[str]:
    if isinstance(urls, str) or not isinstance(urls, (list, tuple)):
        raise RunConfigError(f"capture_urls must be a list of URLs, got {type(urls).__name__}", field="capture_urls")
    if len(urls) > MAX_CAPTURE_SERVERS:
        raise RunConfigError(f"capture_urls lists {len(urls)} URLs; at most {MAX_CAPTURE_SERVERS} are allowed",
                             field="capture_urls")
    checked = [check_capture_url(url, index=i, named=named) for i, url in enumerate(urls)]
    for i, url in enumerate(checked):
        if url in checked[:i]:
            raise RunConfigError(f"{named.format(i + 1)} {url[:100]!r} is listed twice", field="capture_urls")
    return checked


def parse_capture_urls(text: str, *, named: str = "URL {}") -> list[str]:
    """One URL per line, or separated by commas (the form's box); a URL with a space inside is refused."""
    if len(text) > MAX_CAPTURE_SERVERS * (MAX_CAPTURE_URL_CHARS + 2):
        raise RunConfigError(f"{len(text)} characters is too long for {MAX_CAPTURE_SERVERS} URLs",
                             field="capture_urls")
    return check_capture_urls([part.strip() for part in text.replace(",", "\n").splitlines() if part.strip()],
                              named=named)
