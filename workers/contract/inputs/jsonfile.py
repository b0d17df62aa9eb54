"""Reading the small JSON files of model and data directories, with errors that name the file.

Bounded input: a user's file is checked before anything is parsed or stored.

* MAX_JSON_BYTES (8 MiB): config.json of the largest public models is a few KB and manifests a few
  KB more; nothing larger than this is read (the file is never read past the limit).
* MAX_JSON_DEPTH (64): objects/arrays nested deeper are refused. Deep nesting that would exhaust
  the parser's recursion (RecursionError) is caught and reported the same way; the depth of what
  was parsed is measured without recursion.
* The text must be UTF-8; NaN/Infinity, NUL characters and lone surrogates are refused (the
  database's JSON columns cannot store them).
"""
from __future__ import annotations

import json
from pathlib import Path

from workers.contract.inputs.regular_file import NotARegularFile, open_regular

MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_JSON_DEPTH = 64


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number; use a finite number or null")


def check_json_value(data, *, where: str, error: type[Exception], max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse values nested deeper than `max_depth` or holding strings the database cannot store."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > max_depth:
                raise error(f"{where}: nested deeper than {max_depth} levels")
            if isinstance(node, dict):
                for key, value in node.items():
                    _check_string(key, where=where, error=error)
                    stack.append((value, depth + 1))
            else:
                stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str):
            _check_string(node, where=where, error=error)


def _check_string(text: str, *, where: str, error: type[Exception]) -> None:
    if "\x00" in text:
        raise error(f"{where}: a string holds a NUL character (\\u0000), which cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{where}: a string holds a lone surrogate escape (e.g. \\ud800), which is not valid text") from None


def read_json_value(path: Path, error: type[Exception] = ValueError, *, max_bytes: int = MAX_JSON_BYTES,
                    max_depth: int = MAX_JSON_DEPTH):
    """The JSON value in `path`, within the size and depth limits; `error` names the file."""
    path = Path(path)
    try:
        with open_regular(path) as fh:
            blob = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except NotARegularFile as exc:
        raise error(str(exc)) from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc})") from None
    if len(blob) > max_bytes:
        raise error(f"{path}: larger than {max_bytes // (1024 * 1024)} MiB, the limit for this JSON file")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8 JSON") from None
    data = parse_json(text, where=str(path), error=error, max_depth=max_depth)
    check_json_value(data, where=str(path), error=error, max_depth=max_depth)
    return data


def parse_json(text: str, *, where: str, error: type[Exception], max_depth: int = MAX_JSON_DEPTH,
               one_line: bool = False) -> object:
    """json.loads, with every way a user's text can fail turned into `error` naming `where`.

    `one_line`: the text is one line of a JSONL file, which `where` names already, so an error names
    the column alone (json's own "line 2 column 1" counts lines within the text, the line end included)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        if one_line:
            column = min(exc.pos, len(text.rstrip("\r\n"))) + 1  # past the line's end: just after its last character
            raise error(f"{where}, column {column}: not valid JSON ({exc.msg})") from None
        raise error(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise error(f"{where}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # NaN/Infinity, integers too long to convert
        raise error(f"{where}: not usable JSON ({exc})") from None


def read_json_object(path: Path, error: type[Exception] = ValueError, *, max_bytes: int = MAX_JSON_BYTES) -> dict:
    """The JSON object in `path`; `error` names the file and what is wrong with it."""
    data = read_json_value(path, error, max_bytes=max_bytes)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
