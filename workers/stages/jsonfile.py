"""Reading the small JSON files of model and data directories, with errors that name the file."""
from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: Path, error: type[Exception] = ValueError) -> dict:
    """The JSON object in `path`; `error` names the file and what is wrong with it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object")
    return data
