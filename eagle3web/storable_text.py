"""Text PostgreSQL cannot store is refused as input, before any view reads it: a NUL (text columns cannot hold
one, and jsonb refuses the escape \\u0000) and a lone surrogate (U+D800 to U+DFFF: not a character, so not
UTF-8; only a JSON escape such as "\\ud800" can send one). Either once answered 500 (psycopg's DataError).

One rule, whatever the input: 400, naming the field, and nothing read or stored. A filter of a list is refused
too rather than matching nothing, so a pasted stray byte is shown, not silently mistaken for "no such run".

- eagle3web.unstorable_input.UnstorableTextMiddleware checks what every request carries before its view
  runs: the URL path (a capture such as a member's name is named as the route names it), the query
  parameters, a page's form fields, and the cookies (a quoted cookie may say "\\000"; the session's is
  looked up in the database). It answers the API in the API's JSON ({"error", "fields"}) and the pages
  with templates/input_refused.html.
- The API's JSON bodies are checked by runs.api.bodies.parsers as they are parsed, keys and values at any depth,
  the field named by where it sits (config.schedule[0].name).
- Text a form field carries inside it (the saved view's `query`, a query string) is checked where it is
  parsed (runs.tracking.runs_list.run_filters.RunFilters.from_query).
"""
from __future__ import annotations

import re

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def shown(text: str, limit: int = 40) -> str:
    """`text` safe to echo: NUL and surrogates escaped (a surrogate cannot be encoded into an answer), cut short."""
    return _UNSTORABLE.sub(lambda m: ascii(m.group())[1:-1], text[:limit])


def unstorable_reason(text: str) -> str | None:
    """Why `text` cannot be stored ("holds a NUL character (character 5)"), or None when it can."""
    match = _UNSTORABLE.search(text)
    if match is None:
        return None
    where = f"character {match.start() + 1}"
    if match.group() == "\x00":
        return f"holds a NUL character ({where}), which no text can store: remove it"
    return (f"holds a lone surrogate (U+{ord(match.group()):04X}, {where}), which is not a character: send "
            "UTF-8 text (an emoji escaped in JSON is a pair, \\ud83e\\udd85)")


def unstorable_in(value, *, field: str = "") -> tuple[str, str] | None:
    """The first string in `value` (a JSON value: keys and values of objects, items of arrays, at any depth)
    that cannot be stored, as (where, message): where is `field`, `field.key` or `field[3]` (from the top of a
    body: `key`, or `body` for the body itself); a key that cannot be stored is named by the object holding it."""
    where = field or "body"
    if isinstance(value, str):
        reason = unstorable_reason(value)
        return (where, f"{where} {reason}") if reason else None
    if isinstance(value, dict):
        for key, item in value.items():
            reason = unstorable_reason(key) if isinstance(key, str) else None
            if reason:
                return where, f"{where}: the key '{shown(key)}' {reason}"
            found = unstorable_in(item, field=f"{field}.{key}" if field else str(key))
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = unstorable_in(item, field=f"{where}[{index}]")
            if found:
                return found
    return None
