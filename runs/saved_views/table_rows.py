"""The runs list's rows as HTML, one small function per column (templates/runs/tracking/_run_table.html
places them). Django's template language spent about 0.3 ms on each row of 15 cells, a node and a
context lookup per cell, the largest part of a list page built afresh (issue 40); these functions write
the same markup with the template filters the columns used, each value escaped as the template did."""
from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from django.contrib.humanize.templatetags.humanize import naturaltime
from django.template.defaultfilters import date, floatformat
from django.template.loader import render_to_string
from django.utils.html import conditional_escape as esc
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import template_localtime

STAGE_PILLS = (("preparation", "prepare"), ("extract_stage", "extract"), ("vocab_mapping", "vocab"),
               ("training_run", "train"), ("evaluation", "evaluate"))


def _local(value, fmt: str) -> str:
    return date(template_localtime(value), fmt) if value is not None else ""


def _or_dash(text) -> str:
    return esc(text) if text else "–"


def _status(run, status, review, duration) -> str:
    reason = f' title="{esc(run.status_reason)}"' if run.status_reason else ""
    return f'<td><span class="status {esc(status)}"{reason}>{esc(status)}</span></td>'


def _duration(run, status, review, duration) -> str:
    since = None
    if status == "running" and run.external:
        since = run.train_started_at
    elif status == "running" and run.prepare_started_at:
        since = run.prepare_started_at
    attribute = f' data-running-since="{esc(_local(since, "c"))}"' if since is not None else ""
    return f"<td{attribute}>{esc(duration)}</td>"


def _epochs(run, status, review, duration) -> str:
    best = f"best {run.best_epoch + 1} of " if run.best_epoch is not None else ""
    return f"<td>{best}{esc(run.epochs)}</td>"


def _best_val_loss(run, status, review, duration) -> str:
    return f"<td>{_or_dash(floatformat(run.best_val_loss, 4))}</td>"


def _tau(run, status, review, duration) -> str:
    return f"<td>{_or_dash(floatformat(run.shown_tau, 2))}</td>"


def _owner(run, status, review, duration) -> str:
    return f"<td>{esc(run.owner_name)}</td>"


def _created(run, status, review, duration) -> str:
    return f'<td title="{esc(_local(run.created_at, "Y-m-d H:i:s"))}">{esc(naturaltime(run.created_at))}</td>'


def _project(run, status, review, duration) -> str:
    return f"<td>{esc(run.project_name)}</td>"


def _target(run, status, review, duration) -> str:
    return f"<td>{_or_dash(run.target_name)}</td>"


def _dataset(run, status, review, duration) -> str:
    return f"<td>{_or_dash(run.dataset_name)}</td>"


def _layers(run, status, review, duration) -> str:
    return f"<td>{esc(', '.join(map(str, run.layer_ids)))}</td>"


def _stages(run, status, review, duration) -> str:
    if run.external:
        state = esc(next(iter(run.stage_statuses.values())))
        pills = f'<span class="stage-pill {state}" title="trained elsewhere: {state}">train (elsewhere)</span>'
    else:
        pills = "\n".join(f'<span class="stage-pill {esc(run.stage_statuses[name])}" title="{label}: '
                          f'{esc(run.stage_statuses[name])}">{label}</span>' for name, label in STAGE_PILLS)
    return f'<td class="stage-dots">{pills}</td>'


def _tags(run, status, review, duration) -> str:
    return "<td>" + "".join(f'<a class="tag" href="?tag={esc(quote(tag, safe="/"))}">{esc(tag)}</a> '
                            for tag in run.tags) + "</td>"


def _review(run, status, review, duration) -> str:
    # The review's markup has one home, shared with the extractions list.
    return "<td>" + render_to_string("runs/review/_review_state.html", {"review": review}) + "</td>"


CELLS: dict[str, Callable] = {
    "status": _status, "duration": _duration, "epochs": _epochs, "best_val_loss": _best_val_loss, "tau": _tau,
    "owner": _owner, "created": _created, "project": _project, "target": _target, "dataset": _dataset,
    "layers": _layers, "stages": _stages, "tags": _tags, "review": _review,
}


def rows_html(rows: list[tuple], *, columns: tuple[str, ...], launch_url: str) -> SafeString:
    """The table body's rows: `rows` as (ListedRun, status, review, duration text), the columns shown in
    runs.tracking.runs_list.run_filters.COLUMNS' order (the run's name always first)."""
    cells = [CELLS[key] for key in columns if key in CELLS]
    out = []
    for run, status, review, duration in rows:
        pk = str(run.pk)
        name = esc(str(run))
        badges = ((' <span class="badge external" title="trained elsewhere: its trainer reports it through the API">'
                   'external</span>') if run.external else "") + (
            ' <span class="badge archived">archived</span>' if run.archived else "")
        copy = ("" if run.external else f'<a href="{esc(launch_url)}?copy={pk}" '
                'title="the launch form, filled in with this run\'s settings">launch a copy</a>')
        archived = ' data-archived="1"' if run.archived else ""
        out.append(
            f'<tr data-run="{pk}" data-status="{esc(status)}"{archived}>'
            f'<td><input type="checkbox" name="ids" value="{pk}" aria-label="compare {name}"></td>'
            f'<td><a href="{esc(run.get_absolute_url())}">{name}</a>{badges}</td>'
            + "".join(cell(run, status, review, duration) for cell in cells)
            + f"<td>{copy}</td></tr>")
    return mark_safe("\n".join(out))  # noqa: S308 - every value above is escaped
