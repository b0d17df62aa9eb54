"""The API's JSON bodies, read with limits: nesting deeper than MAX_DEPTH is refused (400) before the
body is parsed, a body over DATA_UPLOAD_MAX_MEMORY_SIZE is refused by Django as it is read (413,
runs.api.base), and text PostgreSQL cannot store (the escapes \u0000 and a lone \ud800) is refused naming
where it sits, key or value at any depth (400; eagle3web/storable_text.py). No body of ours nests past a few levels (an
external run's trainer config the deepest), while Python's json recurses once per level and fails past ~1,000 with a
RecursionError."""
from __future__ import annotations

from itertools import accumulate

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.settings import api_settings
from rest_framework.utils import json

from eagle3web.storable_text import unstorable_in
from workers.contract.errors import InputError

MAX_DEPTH = 64

# +1 for an opening bracket, -1 for a closing one, 0 for any other byte.
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """How deep `raw`'s arrays and objects nest (brackets in strings not counted). Every step runs in C:
    a few hundred milliseconds for the largest body Django lets through."""
    # Escaped backslashes, then escaped quotes, out of the way: every quote left opens or closes a
    # string, so the text outside strings is every other piece between quotes.
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


class UnstorableText(InputError):
    """A 400 naming where in the body the text sits (runs.api.base.api_exception_handler)."""

    def __init__(self, message: str, *, field: str):
        super().__init__(message)
        self.field = field


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser (NaN and infinities refused under STRICT_JSON, as before) behind a nesting limit."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        depth = json_depth(raw)
        if depth > MAX_DEPTH:
            raise ParseError(f"the JSON body nests {depth} levels deep; at most {MAX_DEPTH} are accepted")
        encoding = (parser_context or {}).get("encoding", "utf-8")
        parse_constant = json.strict_constant if api_settings.STRICT_JSON else None
        try:
            text = raw.decode(encoding)
            data = json.loads(text, parse_constant=parse_constant)
        except UnicodeDecodeError as exc:
            raise ParseError(f"the JSON body is not valid {encoding}: {exc.reason} at byte {exc.start}") from None
        except RecursionError:  # not reached under MAX_DEPTH; kept so a parse can never be a 500
            raise ParseError(f"the JSON body nests too deep; at most {MAX_DEPTH} levels are accepted") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        # Only an escape can carry either (json refuses a raw NUL, UTF-8 a raw surrogate): a body with none,
        # a batch of 10,000 metric points say, is not walked.
        found = unstorable_in(data) if "\\u" in text else None
        if found:
            raise UnstorableText(found[1], field=found[0])
        return data
