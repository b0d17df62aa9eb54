"""A report's Markdown as HTML: the text through Python-Markdown, then nh3 (an allow-list sanitiser), so
that a <script>, an on* attribute, a style, an image or a javascript: link written in a report is
dropped; then each directive line is replaced by its block, whose HTML is ours (templates/runs/
report_block.html, every value escaped). A directive that names nothing we can draw (an unknown
directive, parameter, column or run) becomes an error block saying so, never a failed page.

The page draws charts and asks for generations from report.js (`blocks`: their specs, as JSON); the
export (runs.reports.export) gets the same blocks with their data inlined and charts drawn as SVG."""
from __future__ import annotations

import difflib
import re
import secrets
from dataclasses import dataclass

import markdown
import nh3
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils.safestring import SafeString, mark_safe

from runs.reports import selectors, svg
from runs.reports.directives import Directive, DirectiveError, directive_lines, directive_parse

MAX_BLOCKS = 30
EXTENSIONS = ["tables", "fenced_code", "sane_lists"]
# nh3's defaults less images: a report's pictures are its charts, and an image from elsewhere is refused by
# the pages' Content-Security-Policy anyway. Links only to the web and mail (no javascript:, no data:).
TAGS = nh3.ALLOWED_TAGS - {"img", "map", "area"}
URL_SCHEMES = {"http", "https", "mailto"}
MAX_KNOWN_SHOWN = 30  # metric names an unknown metric's error lists


def family_of(key: str) -> str:
    """loss_0 -> loss (a TTT step's series belongs to its metric's family, as the run page groups them)."""
    return re.sub(r"_\d+$", "", key)


def markdown_html(text: str) -> str:
    """Markdown as sanitised HTML (no blocks)."""
    html = markdown.markdown(text, extensions=EXTENSIONS, output_format="html")
    return nh3.clean(html, tags=TAGS, url_schemes=URL_SCHEMES, link_rel="noopener noreferrer nofollow")


@dataclass
class Rendered:
    html: SafeString
    blocks: list[dict]  # each block's spec and data, JSON-ready (the page's report.js reads them)

    @property
    def errors(self) -> list[str]:
        return [block["message"] for block in self.blocks if block["kind"] == "error"]


def _generations_url(checkpoint: int) -> str:
    # The generations API may be absent from this deployment's URL map: the page then says "not available".
    try:
        return reverse("api:checkpoint_generations", args=[checkpoint])
    except NoReverseMatch:
        return f"/api/v1/checkpoints/{checkpoint}/generations/"


def _chart(index: int, d: Directive, runs: dict, keys: dict, *, export: bool) -> dict:
    missing_runs = [pk for pk in d.runs if pk not in runs]
    if missing_runs:
        return _error(index, d.source, f"chart: no run {', '.join(map(str, missing_runs))}")
    entries, lacking = [], []
    for colour, pk in enumerate(d.runs):
        run = runs[pk]
        series = sorted(k for k in keys[pk] if (not d.split or k.startswith(d.split + ":"))
                        and d.metric in (k.split(":", 1)[1], family_of(k.split(":", 1)[1])))
        if not series:
            lacking.append(str(run))
        entry = {"id": pk, "name": str(run), "url": run.get_absolute_url(), "colour": colour,
                 "metrics_url": reverse("api:run_metrics", args=[pk]), "series": series}
        if export:
            entry["points"] = selectors.chart_series(run=run, keys=sorted({k.split(":", 1)[1] for k in series}),
                                                     split=d.split)
        entries.append(entry)
    if len(lacking) == len(d.runs) and (unknown := _unknown_metric(d, keys)):
        return _error(index, d.source, unknown)
    block = {"index": index, "kind": "chart", "source": d.source, "metric": d.metric, "split": d.split,
             "runs": entries, "lacking": lacking}
    if export:
        # A colour per line (the SVG has no dashes): a run's TTT steps are told apart as its runs are.
        lines = [{"name": f"{e['name']}: {p['split']} {p['key']}", "steps": p["steps"], "values": p["values"]}
                 for e in entries for p in e["points"]]
        for colour, line in enumerate(lines):
            line["colour"] = colour
        block["svg"] = svg.line_chart(title=f"{d.metric} of {', '.join(e['name'] for e in entries)}", lines=lines)
    return block


def _unknown_metric(d: Directive, keys: dict) -> str:
    """Why none of the chart's runs records its metric, naming the metrics they do record (and the close
    ones first), or "" where they record none yet: points may still come, and the page says so."""
    known = sorted({name for pk in d.runs for k in keys[pk] if not d.split or k.startswith(d.split + ":")
                    for name in (k.split(":", 1)[1], family_of(k.split(":", 1)[1]))})
    if not known:
        return ""
    close = difflib.get_close_matches(d.metric, known, n=3, cutoff=0.6)
    shown = known if len(known) <= MAX_KNOWN_SHOWN else [*known[:MAX_KNOWN_SHOWN], "..."]
    runs = ", ".join(map(str, d.runs))
    return (f"chart: metric={d.metric} does not exist in run{'s' if len(d.runs) > 1 else ''} {runs}"
            f"{' (' + d.split + ')' if d.split else ''}"
            f"{'; did you mean ' + ' or '.join(close) + '?' if close else '.'} Known: {', '.join(shown)}")


def _table(index: int, d: Directive, runs: dict) -> dict:
    missing = [pk for pk in d.runs if pk not in runs]
    if missing:
        return _error(index, d.source, f"table: no run {', '.join(map(str, missing))}")
    rows = [{"run_id": pk, "url": runs[pk].get_absolute_url(),
             "cells": [selectors.table_cell(runs[pk], column) for column in d.columns]} for pk in d.runs]
    return {"index": index, "kind": "table", "source": d.source, "columns": list(d.columns), "rows": rows}


def _generations(index: int, d: Directive, checkpoints: set[int], *, export: bool) -> dict:
    if d.checkpoint not in checkpoints:
        return _error(index, d.source, f"generations: no checkpoint {d.checkpoint}")
    block = {"index": index, "kind": "generations", "source": d.source, "checkpoint": d.checkpoint,
             "prompts": d.prompts, "url": _generations_url(d.checkpoint),
             "checkpoint_url": reverse("runs:checkpoint_detail", args=[d.checkpoint])}
    if export:  # the file has no server to ask: the replies go in it, each token with its class (generations.css)
        block["data"] = data = selectors.generations_for_export(checkpoint_id=d.checkpoint, prompts=d.prompts)
        for prompt in data["prompts"]:
            for token in prompt["tokens"]:
                token["kind"] = (f"pos-{token['proposed_at']}" if token["proposed_at"] is not None
                                 else "prefill" if token["verify_step"] == 0 else "corrected" if token["rejected"]
                                 else "bonus")
                token["shown"] = _shown(token["text"])
                if token["rejected"]:
                    token["rejected"]["shown"] = _shown(token["rejected"]["text"])
    return block


def _shown(text: str) -> str:
    """A token as the checkpoint page shows it (static/js/runs/generations.js): line breaks and tabs drawn."""
    return str(text).replace("\n", "↵\n").replace("\t", "→\t") or "∅"


def _error(index: int, source: str, message: str) -> dict:
    return {"index": index, "kind": "error", "source": source, "message": message}


def report_render(body: str, *, user, export: bool = False) -> Rendered:
    """The report's HTML and its blocks. Reads every run, series summary and checkpoint the blocks name in
    a few queries for the whole report; with `export`, each chart's points too (for its SVG). A run or
    checkpoint `user` does not see (runs.projects.access) is named as one that does not exist."""
    lines = body.splitlines()
    nonce = secrets.token_hex(8)
    found = directive_lines(body)
    parsed: list[Directive | DirectiveError] = []
    for number, (line_index, line) in enumerate(found):
        try:
            parsed.append(directive_parse(line) if number < MAX_BLOCKS
                          else DirectiveError(f"a report embeds at most {MAX_BLOCKS} blocks; this is block {number + 1}"))
        except DirectiveError as exc:
            parsed.append(exc)
        # Its own paragraph, whatever surrounds it: the marker is then a <p> of its own in the HTML.
        lines[line_index] = f"\n\nreportblock{nonce}x{number}\n\n"
    html = markdown_html("\n".join(lines))
    directives = [d for d in parsed if isinstance(d, Directive)]
    runs = selectors.block_runs(ids={pk for d in directives for pk in d.runs}, user=user)
    keys = selectors.run_metric_keys(runs=[runs[pk] for d in directives if d.kind == "chart" for pk in d.runs
                                           if pk in runs])
    checkpoints = selectors.checkpoints_existing(ids={d.checkpoint for d in directives if d.kind == "generations"},
                                                 user=user)
    blocks = []
    for index, d in enumerate(parsed):
        if isinstance(d, DirectiveError):
            block = _error(index, found[index][1].strip(), str(d))
        elif d.kind == "chart":
            block = _chart(index, d, runs, keys, export=export)
        elif d.kind == "table":
            block = _table(index, d, runs)
        else:
            block = _generations(index, d, checkpoints, export=export)
        blocks.append(block)
        piece = render_to_string("runs/reports/report_block.html", {"block": block, "export": export})
        marker = f"reportblock{nonce}x{index}"
        html = html.replace(f"<p>{marker}</p>", piece, 1) if f"<p>{marker}</p>" in html else html.replace(marker, piece, 1)
    # The markers are ours (a fresh nonce per rendering); the rest passed nh3, the blocks are escaped templates.
    return Rendered(html=mark_safe(html), blocks=[{k: v for k, v in b.items() if k != "svg"} for b in blocks])

