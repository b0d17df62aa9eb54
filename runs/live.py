"""What live pages poll, answered cheaply: conditional requests and a cache shared by every viewer.

An answer's ETag is built from the run's change counters (runs.pipeline.status.changes), read before anything
else; a poll that sends it back (If-None-Match) while they have not moved gets 304 with no body, no
rendering and no other query. Otherwise the answer comes from Django's cache, keyed by the same
counters, and is built only by the first viewer after a change: the key moves with the data, so
nothing is ever invalidated and no entry can be stale.

The cache is the local memory of each web process (Django's default), not Redis: keys carry the
counters read from the database on every request, so a process never serves an outdated entry and
nothing must be shared or invalidated across processes; a hit costs no round trip; and the demo runs
without Redis. The price: each process builds each answer once per change (gunicorn's 5 workers: at
most 5 times, where a shared cache would build it once).
"""
from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable

from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_vary_headers
from django.utils.http import parse_etags

# Answers larger than this are built for each request instead: the cache keeps up to 200 entries a
# process (settings.CACHES), which must not add up to gigabytes (a whole curve of 64 series at 20,000
# points is ~30 MB; twelve at 2,000, what a run of the demo draws, ~250 kB).
MAX_CACHED_BYTES = 2**20
# A running run's summary says how long its stage has run: kept this long, so a page opened later reads
# a duration at most this old (pages already open count on from it themselves).
RUNNING_SECONDS = 2
# What cannot change without its counter moving is kept until the cache needs the room.
SETTLED_SECONDS = 3600
# A cached answer at least this long goes gzipped to a client that takes it (the curves: JSON numbers shrink
# about 3x), compressed once per build at zlib's fastest level; a smaller one is not worth the header.
GZIP_AT = 1024


def etag(*parts) -> str:
    """A strong ETag from the counters and whatever else picks the answer (a query's parameters)."""
    text = ".".join(str(part) for part in parts)
    return '"' + hashlib.blake2s(text.encode(), digest_size=12).hexdigest() + '"'


def not_modified(request: HttpRequest, tag: str) -> HttpResponse | None:
    """304 when the request's If-None-Match names this ETag (weak comparison, as RFC 9110 asks of it)."""
    header = request.headers.get("If-None-Match")
    if not header:
        return None
    sent = parse_etags(header)
    if "*" not in sent and tag.removeprefix("W/") not in {t.removeprefix("W/") for t in sent}:
        return None
    return _headers(HttpResponse(status=304), tag)


def _headers(response: HttpResponse, tag: str) -> HttpResponse:
    response["ETag"] = tag
    # Browsers keep the answer but ask again each time (the pages' scripts send the ETag themselves).
    response["Cache-Control"] = "private, no-cache"
    return response


def json_bytes(data) -> bytes:
    return json.dumps(data, cls=DjangoJSONEncoder).encode()


def cached(key: tuple, build: Callable[[], tuple[object, int]]):
    """The value cached under `key`, or build() -> (value, seconds to keep it) and cache it. A text or
    bytes over MAX_CACHED_BYTES is answered but not kept."""
    # A query string may hold anything: the key is its digest (memcached's rules, which Django checks).
    text = f"live:{key[0]}:" + hashlib.blake2s(repr(key).encode(), digest_size=16).hexdigest()
    value = cache.get(text)
    if value is None:
        value, seconds = build()
        if not (isinstance(value, (bytes, str)) and len(value) > MAX_CACHED_BYTES):
            cache.set(text, value, seconds)
    return value


def json_answer(*, tag: str, body: bytes) -> HttpResponse:
    return _headers(HttpResponse(body, content_type="application/json"), tag)


def takes_gzip(request: HttpRequest) -> bool:
    """Whether Accept-Encoding names gzip (or *) with a quality above 0, as every browser sends it."""
    for part in request.headers.get("Accept-Encoding", "").split(","):
        coding, _, params = part.strip().partition(";")
        quality = params.strip().removeprefix("q=") if params.strip().startswith("q=") else "1"
        if coding.strip().lower() in ("gzip", "*"):
            try:
                return float(quality) > 0
            except ValueError:
                return False
    return False


def json_answer_gzipped(request: HttpRequest, *, key: tuple, tag: str, body: bytes,
                        seconds: int = SETTLED_SECONDS) -> HttpResponse:
    """json_answer, gzipped for a client that takes it when the body is GZIP_AT or more: compressed once per
    process for every viewer (cached beside the body under `key`, kept as long as the body: `seconds`). Its ETag
    is the same one, weak, as RFC 9110 asks of another encoding of the same content (not_modified compares weakly)."""
    if len(body) < GZIP_AT or not takes_gzip(request):
        response = json_answer(tag=tag, body=body)
    else:
        packed = cached((*key, "gzip"), lambda: (gzip.compress(body, compresslevel=1, mtime=0), seconds))
        response = _headers(HttpResponse(packed, content_type="application/json"), "W/" + tag)
        response["Content-Encoding"] = "gzip"
    patch_vary_headers(response, ("Accept-Encoding",))
    return response
