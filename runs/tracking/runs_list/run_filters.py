"""The runs list's query parameters (the page's, the API's and a saved view's): each read, checked and
refused naming the parameter, into one RunFilters; runs.tracking.runs_list.run_table turns that into the query."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from eagle3web.storable_text import shown, unstorable_reason
from runs.pipeline.launch.run_config import RunConfig
from runs.pipeline.launch.setting_bounds import FLOAT_FIELDS, INT_FIELDS, RunConfigError, renamed_setting
from runs.pipeline.launch.setting_checks import parse_layer_ids
from runs.pipeline.status.run_status import RUN_STATUSES
from workers.contract.errors import InputError

MAX_QUERY_CHARS = 200
SORTS = {
    "created": "created_at", "name": "name", "status": "status", "duration": "duration",
    "best_val_loss": "best_val_loss", "tau": "tau", "owner": "owner__username",
    "epochs": "training_run__epochs",
}
STATUSES = RUN_STATUSES  # the stages' words and "held" (a sweep's run not yet handed to the queues)
COLUMNS = (("name", "Run"), ("status", "Status"), ("duration", "Duration"), ("epochs", "Epochs"),
           ("best_val_loss", "Best val loss"), ("tau", "τ"), ("owner", "Owner"), ("created", "Created"),
           ("project", "Project"), ("target", "Target"), ("dataset", "Dataset"), ("layers", "Layers"),
           ("stages", "Stages"), ("tags", "Tags"), ("review", "Review"))
COLUMN_KEYS = tuple(key for key, _ in COLUMNS)
# `archived`: "" hides archived runs (the default), "with" shows them among the others, "only" alone.
ARCHIVED = ("", "with", "only")
# A filter on a setting: `setting.<RunConfig field>=<value>`, the value as the launch form takes it.
SETTING_PREFIX = "setting."
SETTING_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))
MAX_SETTING_FILTERS = 10
# Every parameter the list reads (setting.<field> besides); the API refuses others.
PARAMS = ("q", "status", "target", "dataset", "owner", "tag", "project", "sweep", "tau_min", "tau_max", "archived",
          "settings", "columns", "sort", "page")


class RunTableError(InputError):
    """A filter or sort the runs list does not know."""


@dataclass(frozen=True)
class RunFilters:
    q: str = ""
    status: str = ""
    target: str = ""
    dataset: str = ""
    owner: str = ""
    tag: str = ""
    project: str = ""
    sweep: int | None = None
    tau_min: float | None = None
    tau_max: float | None = None
    archived: str = ""
    settings: tuple = ()  # ((field, value), ...)
    columns: tuple = COLUMN_KEYS
    sort: str = "created"
    descending: bool = True
    page: int = 1

    @classmethod
    def from_query(cls, params) -> "RunFilters":
        _refuse_unstorable(params)

        def text(name: str) -> str:
            value = params.get(name, "").strip()
            if len(value) > MAX_QUERY_CHARS:
                raise RunTableError(f"{name} is {len(value)} characters long; at most {MAX_QUERY_CHARS}")
            return value

        sort = text("sort") or "-created"
        descending = sort.startswith("-")
        if sort.lstrip("-") not in SORTS:
            raise RunTableError(f"sort by {sort.lstrip('-')[:40]!r} is not offered (one of {', '.join(SORTS)})")
        status = text("status")
        if status and status not in STATUSES:
            raise RunTableError(f"status {status[:40]!r} is not a run status (one of {', '.join(STATUSES)})")
        page = text("page") or "1"
        if not (page.isascii() and page.isdigit()) or not 1 <= int(page) <= 10**6:
            raise RunTableError(f"page must be a number from 1, got {page[:20]!r}")
        archived = text("archived")
        if archived not in ARCHIVED:
            raise RunTableError(f"archived must be empty, 'with' or 'only', got {archived[:20]!r}")
        return cls(q=text("q"), status=status, target=text("target"), dataset=text("dataset"), owner=text("owner"),
                   tag=text("tag"), project=text("project"), sweep=_whole(text("sweep"), "sweep"),
                   tau_min=_number(text("tau_min"), "tau_min"), tau_max=_number(text("tau_max"), "tau_max"),
                   archived=archived, settings=_settings(params), columns=_columns(_joined(params, "columns")),
                   sort=sort.lstrip("-"), descending=descending, page=int(page))

    @property
    def narrowed(self) -> bool:
        """Whether any filter is set (the empty table then says no run matches, not that there are none)."""
        return bool(self.q or self.status or self.target or self.dataset or self.owner or self.tag or self.project
                    or self.sweep or self.tau_min is not None or self.tau_max is not None or self.archived
                    or self.settings)

    def sort_link(self, column: str) -> str:
        """The `sort` value a column header links to: the same column flips the order."""
        if column == self.sort:
            return column if self.descending else f"-{column}"
        return f"-{column}" if column in ("created", "best_val_loss", "tau", "duration") else column


def _refuse_unstorable(params) -> None:
    """Text PostgreSQL cannot store is refused, naming the parameter. A request's own query never gets here
    with any (eagle3web/storable_text.py); a query a form field carries does (a saved view's `query`)."""
    pairs = params.lists() if hasattr(params, "lists") else ((name, [value]) for name, value in params.items())
    for name, values in pairs:
        for text in (name, *values):
            reason = unstorable_reason(str(text))
            if reason:
                raise RunTableError(f"{shown(str(name))} {reason}")


def _whole(value: str, name: str) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise RunTableError(f"{name} must be an id (a whole number), got {value[:20]!r}")
    return int(value)


def _number(value: str, name: str) -> float | None:
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise RunTableError(f"{name} must be a number, got {value[:20]!r}")
    return number


def _joined(params, name: str) -> str:
    """A parameter given once ("name,tau") or as ticked boxes (columns=name&columns=tau), as one text."""
    values = params.getlist(name) if hasattr(params, "getlist") else [params.get(name, "")]
    value = ",".join(str(v) for v in values if v)
    if len(value) > MAX_QUERY_CHARS:
        raise RunTableError(f"{name} is {len(value)} characters long; at most {MAX_QUERY_CHARS}")
    return value


def _columns(value: str) -> tuple:
    if not value:
        return COLUMN_KEYS
    keys = [key.strip() for key in value.split(",") if key.strip()]
    unknown = [key for key in keys if key not in COLUMN_KEYS]
    if unknown:
        raise RunTableError(f"columns: {unknown[0][:40]!r} is not a column (one of {', '.join(COLUMN_KEYS)})")
    return tuple(key for key in COLUMN_KEYS if key in keys or key == "name")  # the run's name links to it: always


def _setting_value(name: str, text: str):
    """A setting's value as the run's config stores it."""
    try:
        if name in INT_FIELDS:
            return int(text)
        if name in FLOAT_FIELDS:
            return _number(text, SETTING_PREFIX + name)
        if name == "layer_ids":
            return parse_layer_ids(text)
    except (ValueError, RunConfigError):
        raise RunTableError(f"{SETTING_PREFIX}{name} must be a {'whole number' if name in INT_FIELDS else 'list of ids'}, "
                            f"got {text[:20]!r}") from None
    if name == "serve_check":
        if text not in ("true", "false"):
            raise RunTableError(f"{SETTING_PREFIX}{name} must be true or false, got {text[:20]!r}")
        return text == "true"
    return text


def _typed_settings(params) -> list[tuple[str, str]]:
    """(setting, value as typed): `setting.<name>=<value>` parameters, and the filter box's `settings`
    ("epochs=2; lr=3e-4", `;` between settings since layer ids hold commas)."""
    pairs = [(key[len(SETTING_PREFIX):], str(params.get(key, ""))) for key in params if key.startswith(SETTING_PREFIX)]
    typed = str(params.get("settings", "") or "")
    if len(typed) > MAX_QUERY_CHARS:
        raise RunTableError(f"settings is {len(typed)} characters long; at most {MAX_QUERY_CHARS}")
    for part in typed.split(";"):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise RunTableError(f"settings: {part.strip()[:40]!r} is not setting=value (e.g. epochs=2; lr=3e-4)")
        pairs.append((name.strip(), value))
    return pairs


def settings_text(settings: tuple) -> str:
    """The setting filters as the filter box takes them."""
    def shown(value) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return ",".join(str(i) for i in value) if isinstance(value, list) else f"{value:g}" if isinstance(
            value, float) else str(value)

    return "; ".join(f"{name}={shown(value)}" for name, value in settings)


def _settings(params) -> tuple:
    found = []
    for name, value in _typed_settings(params):
        if why := renamed_setting(name):
            raise RunTableError(f"settings: {why}")
        if name not in SETTING_FIELDS:
            raise RunTableError(f"settings: {name[:60]!r} is not a setting (one of {', '.join(SETTING_FIELDS)})")
        value = value.strip()
        if not value:
            continue
        if len(value) > MAX_QUERY_CHARS:
            raise RunTableError(f"settings: {name} is {len(value)} characters long; at most {MAX_QUERY_CHARS}")
        found.append((name, _setting_value(name, value)))
    if len(found) > MAX_SETTING_FILTERS:
        raise RunTableError(f"{len(found)} setting filters; at most {MAX_SETTING_FILTERS}")
    return tuple(sorted(found, key=lambda pair: pair[0]))
