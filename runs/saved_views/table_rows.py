"""The runs list's rows as HTML, one small function per column (templates/runs/tracking/_run_table.html
places them). Django's template language spent about 0.3 ms on each row of 15 cells, a node and a
context lookup per cell, the largest part of a list page built afresh (issue 40); these functions write
the same markup with the template filters the columns used, each value escaped as the template did."""
from __future__ import annotations

import html
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from urllib.parse import quote

from django.conf import settings
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.template.defaultfilters import floatformat
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from runs.tracking.runs_list.run_table import duration_text

STAGE_PILLS = (("preparation", "prepare"), ("extract_stage", "extract"), ("vocab_mapping", "vocab"),
               ("training_run", "train"), ("evaluation", "evaluate"))


def esc(value) -> str:
    """django.utils.html.conditional_escape's text for the cells' values, without its check of every argument
    for a lazy text (a third of the rows' time went to it, issue 40): what is safe already stays as it is."""
    return value.__html__() if hasattr(value, "__html__") else html.escape(str(value))


def _local(value, zone):
    """template_localtime(value) with the current time zone looked up once a table (`zone`, None without USE_TZ):
    looking it up took 8 µs a cell, most of a time cell's cost."""
    return value.astimezone(zone) if zone is not None and value.tzinfo is not None else value


def _iso(value, zone) -> str:
    """The `date` filter's "c" of the time in the current time zone, as the template wrote it: ISO 8601."""
    return _local(value, zone).isoformat() if value is not None else ""


def _seconds(value, zone) -> str:
    """The `date` filter's "Y-m-d H:i:s" of the time in the current time zone, as the template wrote it."""
    at = _local(value, zone)
    return f"{at.year:04d}-{at.month:02d}-{at.day:02d} {at.hour:02d}:{at.minute:02d}:{at.second:02d}"


_QUANTA = {2: Decimal("0.01"), 4: Decimal("0.0001")}


def _fixed(value, places: int) -> str:
    """The `floatformat` filter's `places` decimals of `value`, as the template wrote it: the float's shortest
    decimal rounded half up, no minus before a zero. Its own way for a float from 1e-6 to 999, where no thousands
    separator can appear nor the filter's odd answers to the tiniest floats (a fiftieth of a list built afresh went
    to the filter's generality); the filter's otherwise."""
    if type(value) is float and (1e-6 < abs(value) < 999 or value == 0):
        text = str(Decimal(repr(value)).quantize(_QUANTA[places], ROUND_HALF_UP))
        return text[1:] if text[0] == "-" and not text.strip("-0.") else text
    return floatformat(value, places)


def _or_dash(text) -> str:
    return esc(text) if text else "–"


def _status(run, review, zone) -> str:
    reason = f' title="{esc(run.status_reason)}"' if run.status_reason else ""
    return f'<td><span class="status {esc(run.status)}"{reason}>{esc(run.status)}</span></td>'


def _duration(run, review, zone) -> str:
    since = None
    if run.status == "running" and run.external:
        since = run.train_started_at
    elif run.status == "running" and run.prepare_started_at:
        since = run.prepare_started_at
    attribute = f' data-running-since="{esc(_iso(since, zone))}"' if since is not None else ""
    return f"<td{attribute}>{esc(duration_text(run.duration))}</td>"


def _epochs(run, review, zone) -> str:
    best = f"best {run.best_epoch + 1} of " if run.best_epoch is not None else ""
    return f"<td>{best}{esc(run.epochs)}</td>"


def _best_val_loss(run, review, zone) -> str:
    return f"<td>{_or_dash(_fixed(run.best_val_loss, 4))}</td>"


def _tau(run, review, zone) -> str:
    return f"<td>{_or_dash(_fixed(run.shown_tau, 2))}</td>"


def _owner(run, review, zone) -> str:
    return f"<td>{esc(run.owner_name)}</td>"


def _created(run, review, zone) -> str:
    return f'<td title="{esc(_seconds(run.created_at, zone))}">{esc(naturaltime(run.created_at))}</td>'


def _project(run, review, zone) -> str:
    return f"<td>{esc(run.project_name)}</td>"


def _target(run, review, zone) -> str:
    return f"<td>{_or_dash(run.target_name)}</td>"


def _dataset(run, review, zone) -> str:
    return f"<td>{_or_dash(run.dataset_name)}</td>"


def _layers(run, review, zone) -> str:
    return f"<td>{esc(', '.join(map(str, run.layer_ids)))}</td>"


def _stages(run, review, zone) -> str:
    if run.external:
        state = esc(next(iter(run.stage_statuses.values())))
        pills = f'<span class="stage-pill {state}" title="trained elsewhere: {state}">train (elsewhere)</span>'
    else:
        pills = "\n".join(f'<span class="stage-pill {esc(run.stage_statuses[name])}" title="{label}: '
                          f'{esc(run.stage_statuses[name])}">{label}</span>' for name, label in STAGE_PILLS)
    return f'<td class="stage-dots">{pills}</td>'


def _tags(run, review, zone) -> str:
    return "<td>" + "".join(f'<a class="tag" href="?tag={esc(quote(tag, safe="/"))}">{esc(tag)}</a> '
                            for tag in run.tags) + "</td>"


def _review(run, review, zone) -> str:
    # The review's markup has one home, shared with the extractions list.
    return "<td>" + render_to_string("runs/review/_review_state.html", {"review": review}) + "</td>"


CELLS: dict[str, Callable] = {
    "status": _status, "duration": _duration, "epochs": _epochs, "best_val_loss": _best_val_loss, "tau": _tau,
    "owner": _owner, "created": _created, "project": _project, "target": _target, "dataset": _dataset,
    "layers": _layers, "stages": _stages, "tags": _tags, "review": _review,
}


def rows_html(runs: list, reviews: dict, *, columns: tuple[str, ...], launch_url: str) -> SafeString:
    """The table body's rows: `runs` (runs.tracking.runs_list.run_table.ListedRun), each with its review
    state from `reviews` (by run id), the columns shown in run_filters.COLUMNS' order (the run's name always
    first)."""
    cells = [CELLS[key] for key in columns if key in CELLS]
    zone = timezone.get_current_timezone() if settings.USE_TZ else None
    # The run page's address, reversed once for the page and not once a row (ListedRun.get_absolute_url's).
    marker = 2**62  # no run's id
    before, after = reverse("runs:run_detail", args=[marker]).split(str(marker))
    launch_url = esc(launch_url)
    out = []
    for run in runs:
        review = reviews.get(run.pk)
        pk = str(run.pk)
        name = esc(str(run))
        badges = ((' <span class="badge external" title="trained elsewhere: its trainer reports it through the API">'
                   'external</span>') if run.external else "") + (
            ' <span class="badge archived">archived</span>' if run.archived else "")
        copy = ("" if run.external else f'<a href="{launch_url}?copy={pk}" '
                'title="the launch form, filled in with this run\'s settings">launch a copy</a>')
        archived = ' data-archived="1"' if run.archived else ""
        out.append(
            f'<tr data-run="{pk}" data-status="{esc(run.status)}"{archived}>'
            f'<td><input type="checkbox" name="ids" value="{pk}" aria-label="compare {name}"></td>'
            f'<td><a href="{esc(before + pk + after)}">{name}</a>{badges}</td>'
            + "".join(cell(run, review, zone) for cell in cells)
            + f"<td>{copy}</td></tr>")
    return mark_safe("\n".join(out))  # noqa: S308 - every value above is escaped
