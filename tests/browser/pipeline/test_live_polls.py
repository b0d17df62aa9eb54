"""The run page's polls in headless Chromium: while the run trains, one poll brings the status and the new curve
points (runs.api.views.run_poll), where the page made two requests each interval; it sends back the ETag of its last
answer (If-None-Match, set by static/js/shared/live_fetch.js), gets 304 while nothing changed and keeps what it shows
(a running stage's duration still counts on), and gets 200 with the new figures once a point or a step arrives."""
from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from runs.pipeline.lifecycle.stage_services import stage_progress
from runs.tracking.services import metrics_record
from tests.browser.every_page.test_pages_at_a_glance import _log_in, _training_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_run_page_polls_with_etags_and_redraws_once_something_changed(live_server, user, roots, page):
    run = _training_run(user, roots, name="polled", steps=40)
    answers = []  # (path, status, If-None-Match sent, ETag answered), in the order they came

    def heard(response):
        if "/api/v1/runs/" in response.url:
            path = response.url.removeprefix(live_server.url)
            answers.append((path, response.status, response.request.headers.get("if-none-match"),
                            response.headers.get("etag")))

    page.on("response", heard)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#plot-loss .main-svg").first).to_be_visible(timeout=20_000)
    # The one poll asks for the status's live part (what moved since the state of the whole summary it holds) and
    # the curves' steps after the newest one held.
    poll = re.compile(rf"^/api/v1/runs/{run.pk}/status/\?since=\d+&curves_start=41$")

    def not_modified() -> list:
        return [a for a in answers if poll.match(a[0]) and a[1] == 304]

    deadline = time.monotonic() + 20
    while not not_modified() and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert not_modified(), answers
    # Every 304 answered a poll that sent the ETag its URL last answered with.
    last = {}
    for path, status, sent, tag in answers:
        if status == 304:
            assert sent and sent == last[path], (path, answers)
        elif status == 200:
            last[path] = tag
    # While nothing changes, the running stage's duration still counts on.
    seconds = page.locator('#stages tr[data-stage="train"] [data-field="seconds"]')
    before = float(seconds.inner_text().split()[0])
    page.wait_for_timeout(3500)  # the duration is redrawn every 2 s: at least one redraw, 1.5 s later or more
    assert float(seconds.inner_text().split()[0]) > before + 1

    # A point arrives: the poll gets 200 (its old ETag no longer matches) and the chart grows.
    metrics_record(training_run_id=run.training_run.pk, points=[
        {"split": "train", "key": f"loss_{k}", "step": 41, "epoch": 0.41, "value": 0.5 + k} for k in range(3)])
    page.wait_for_function("document.getElementById('plot-loss').data[0].x.includes(41)", timeout=15_000)
    # That 200 answered a poll that had sent an ETag: the point retired it.
    assert [a for a in answers if poll.match(a[0]) and a[1] == 200 and a[2] is not None], answers
    # A step: the poll (now from 42) gets 200 and the header follows.
    stage_progress(stage_name="train", record_id=run.training_run.pk, done=41, total=100, log_tail="")
    expect(page.locator('[data-glance="train_step"]')).to_have_text("41 of 100", timeout=15_000)
    moved = re.compile(rf"^/api/v1/runs/{run.pk}/status/\?since=\d+&curves_start=42$")
    assert [a for a in answers if moved.match(a[0]) and a[1] == 200 and a[2] is not None], answers


def test_a_training_run_page_makes_one_poll_request_an_interval_where_it_made_two(live_server, user, roots, page):
    """Points arrive four times: each is drawn, the header follows the step, and the page asked nothing but the one
    poll (the old page asked the status every 2 s and the curves apart). The system charts' own poll (every 5 s,
    split=system) is not counted."""
    run = _training_run(user, roots, name="one poll", steps=40)
    asked = []
    page.on("request", lambda r: asked.append(r.url.removeprefix(live_server.url)) if "/api/v1/runs/" in r.url
            and "split=system" not in r.url else None)
    _log_in(page, live_server, user)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#plot-loss .main-svg").first).to_be_visible(timeout=20_000)
    page.wait_for_function("document.getElementById('plot-loss').data[0].x.includes(40)", timeout=15_000)
    page.wait_for_timeout(2500)  # the first poll after the whole read has gone: the one poll carries the status
    counted = len(asked)
    for step in range(41, 45):
        metrics_record(training_run_id=run.training_run.pk, points=[
            {"split": "train", "key": f"loss_{k}", "step": step, "epoch": step / 100, "value": 0.5 + k} for k in range(3)])
        stage_progress(stage_name="train", record_id=run.training_run.pk, done=step, total=100, log_tail="")
        page.wait_for_function(f"document.getElementById('plot-loss').data[0].x.includes({step})", timeout=15_000)
        expect(page.locator('[data-glance="train_step"]')).to_have_text(f"{step} of 100", timeout=15_000)
    polls = asked[counted:]
    one = re.compile(rf"^/api/v1/runs/{run.pk}/status/\?since=\d+&curves_start=\d+$")
    assert all(one.match(url) for url in polls), polls
    # Step 41 may come in a poll sent before the count began; each later step must have been asked for by the one
    # poll, from the step after the newest drawn.
    starts = {int(url.rsplit("=", 1)[1]) for url in polls}
    assert {42, 43, 44} <= starts, polls
