"""The run page as a browser keeps it open, for bench/load/load.py --viewers N (imported by it).

Each viewer does what the page's scripts do, at the intervals read from those scripts themselves:
- static/js/runs/run_detail.js polls the run's status, waiting its interval after each answer, with `?since=<the
  state_version it holds>` (the live part while the run's state stands still): the page's own summary's
  first (templates/runs/pipeline/_run_body.html brings it), then that of each whole summary it gets; it stops
  asking once the curves' loop carries the status (below);
- static/js/runs/curves.js reads the whole curves once (`?points=2000`), then polls the status and the steps after
  the newest one it holds in one request (`status/?since=V&curves_start=S`: runs.api.views.run_poll), asks a
  series again from its own last step where its count says it missed points before S, and waits between polls
  MIN_POLL_MS, or half the time between the last two polls that brought news (points or a status), growing 1.5
  times after each poll that found nothing (a 304), at most MAX_POLL_MS;
- static/js/shared/live_fetch.js sends each poll's If-None-Match: the ETag of its loop's last answer from
  the same URL (the one poll: from any URL), and keeps what it has on a 304;
- the browser takes gzip (Accept-Encoding), and the bytes counted are those the server sent;
- and the viewer reloads the page every minute: the page's HTML, then both loops from scratch (no
  ETag, the whole curves), as a browser does (its static files are cached; not requested).
Viewers open their pages at random moments of the warm-up and reload at a random phase of the minute,
as people who opened the page at different times; only requests that start after the warm-up count.
They run as threads spread over a few client processes (--client-processes), so that a viewer's
timing does not include waiting for another's turn at one Python interpreter.
"""
from __future__ import annotations

import gzip
import http.client
import json
import multiprocessing
import random
import re
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELOAD_SECONDS = 60.0
POINTS = 2000


def get(port: int, path: str, *, cookies: dict, headers: dict) -> tuple[int, bytes, dict]:
    """One GET on a fresh connection (gunicorn's sync workers close each one) with the viewer's headers, taking
    gzip as a browser does; returns (status, body unzipped, the answer's ETag and the bytes it sent)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Host": "127.0.0.1", "Accept-Encoding": "gzip, deflate, br", **headers,
                                           "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})
        response = conn.getresponse()
        body = response.read()
        sent = len(body)
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return response.status, body, {"ETag": response.headers.get("ETag"), "bytes": sent}
    finally:
        conn.close()


def page_timings() -> dict[str, float]:
    """The run page's own intervals, read from its scripts (so that the benchmark follows them)."""
    detail = (REPO / "static/js/runs/run_detail.js").read_text()
    curves = (REPO / "static/js/runs/curves.js").read_text()
    status = re.search(r"setTimeout\(poll, (\d+)\)", detail)
    curve = re.search(r"const MIN_POLL_MS = (\d+), MAX_POLL_MS = (\d+);", curves)
    adapted = "setTimeout(poll, pollMs)" in curves and "(now - lastNewsAt) / 2" in curves and "pollMs * 1.5" in curves
    adapted = adapted and "status.url({curves_start: start})" in curves and "window.runStatus.carried" in detail
    points = re.search(r"const POINTS = (\d+);", curves)
    if not (status and curve and adapted and points) or int(points[1]) != POINTS:
        raise SystemExit("static/js/runs/run_detail.js or curves.js no longer poll as bench/load/viewers.py expects: update it")
    return {"status_s": int(status[1]) / 1000, "curves_min_s": int(curve[1]) / 1000, "curves_max_s": int(curve[2]) / 1000}


class Viewer:
    """One open run page; appends (name, ms, ok, bytes, http status, started, error body's start or None)
    to `samples`."""

    def __init__(self, *, port: int, cookies: dict, run_id: int, timings: dict, begin: float, warmup: float,
                 deadline: float, samples: list, seed: int):
        self.port, self.cookies, self.run_id, self.timings = port, cookies, run_id, timings
        self.begin, self.warmup, self.deadline, self.samples = begin, warmup, deadline, samples
        self.rng = random.Random(seed)
        self.etags: dict[str, tuple[str, str]] = {}  # loop -> (url, etag), as live_fetch.js keeps them
        self.held: dict[str, tuple[int, int]] = {}  # "split:key" -> (last step, points counted), as curves.js keeps them
        self.poll_s = timings["curves_min_s"]
        self.last_news = 0.0  # when a curve poll last brought points (monotonic)
        self.state_version: int | None = None  # of the whole summary held (None: none yet)
        self.carried = False  # the curves' loop asks for the status too (run_detail.js then asks nothing)

    def _get(self, name: str, path: str, loop: str | None = None) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"} if loop else {"Accept": "text/html"}
        known = self.etags.get(loop) if loop else None
        if known and (known[0] == path or loop == "run-poll"):
            headers["If-None-Match"] = known[1]
        started = time.monotonic()
        try:
            status, body, answer = get(self.port, path, cookies=self.cookies, headers=headers)
        except OSError as exc:
            status, body, answer = type(exc).__name__, b"", {}
        ms = (time.monotonic() - started) * 1000
        ok = status == 200 or (status == 304 and "If-None-Match" in headers)
        if started >= self.begin + self.warmup:
            # A failure keeps the start of its body, so the report can say what the server answered.
            self.samples.append((name, ms, ok, answer.get("bytes", 0), status, started,
                                 None if ok else body[:300].decode(errors="replace")))
        if status == 200 and loop and answer.get("ETag"):
            self.etags[loop] = (path, answer["ETag"])
        return status, body

    def _load_page(self) -> None:
        status, body = self._get("run_page", f"/runs/{self.run_id}/")
        self.etags.clear()
        self.held.clear()
        self.poll_s, self.last_news = self.timings["curves_min_s"], 0.0
        self.carried = False
        # As run_detail.js: the page brings its summary (its state_version), so the first poll asks since then.
        held = re.search(rb'"state_version": (\d+)', body) if status == 200 else None
        self.state_version = int(held[1]) if held else None

    def _status_url(self, **params) -> str:
        # As run_detail.js: once it holds a whole summary, what moved since its state (the live part).
        query = {**({"since": self.state_version} if self.state_version is not None else {}), **params}
        return f"/api/v1/runs/{self.run_id}/status/" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")

    def _took_status(self, summary: dict) -> None:
        if not summary.get("live"):
            self.state_version = summary.get("state_version")

    def _poll_status(self) -> None:
        if self.carried:
            return  # the one poll brings it
        status, body = self._get("status_poll", self._status_url(), "status")
        if status == 200:
            self._took_status(json.loads(body))

    def _hold(self, series: list[dict]) -> bool:
        """What curves.js keeps of an answer; True when it brought points."""
        news = False
        for s in series:
            name = f"{s['split']}:{s['key']}"
            news |= self.held.get(name) != (s["last_step"], s["num_points"])
            self.held[name] = (s["last_step"], s["num_points"])
        return news

    def _poll_curves(self) -> None:
        base = f"/api/v1/runs/{self.run_id}/metrics/"
        if not self.held:
            status, body = self._get("curve_full", f"{base}?points={POINTS}", "all")
            if status == 200:
                self._hold(json.loads(body)["series"])
            return
        since = max(-1 if step is None else step for step, _ in self.held.values()) + 1
        self.carried = True
        status, body = self._get("run_poll", self._status_url(curves_start=since), "run-poll")
        answer = json.loads(body) if status == 200 else None
        if answer:
            self._took_status(answer["status"])
        series = answer["curves"]["series"] if answer else []
        for i, s in enumerate(series):
            step, counted = self.held.get(f"{s['split']}:{s['key']}", (None, 0))
            if s["num_points"] - counted - s["points_in_window"] > 0:  # points before `since`: that series again
                again, body = self._get("curve_catch_up", f"{base}?keys={s['key']}&split={s['split']}&start="
                                        f"{0 if step is None else step + 1}&points={POINTS}")
                series[i] = json.loads(body)["series"][0] if again == 200 else s
        now = time.monotonic()
        if self._hold(series) or answer:
            if self.last_news:
                self.poll_s = min(self.timings["curves_max_s"], max(self.timings["curves_min_s"], (now - self.last_news) / 2))
            self.last_news = now
        else:
            self.poll_s = min(self.timings["curves_max_s"], self.poll_s * 1.5)

    def run(self) -> None:
        opened = self.begin + self.rng.uniform(0, self.warmup)
        # The page loads, then both loops run; each waits its interval after its answer.
        due = {"reload": opened, "status": float("inf"), "curves": float("inf")}
        first_reload = True
        while True:
            what = min(due, key=due.get)
            wait = due[what] - time.monotonic()
            if due[what] >= self.deadline:
                return
            if wait > 0:
                time.sleep(wait)
            if what == "reload":
                self._load_page()
                now = time.monotonic()
                due.update(status=now, curves=now)
                # People opened their pages at different times: the first reload falls anywhere in the minute.
                due["reload"] = now + (self.rng.uniform(0, RELOAD_SECONDS) if first_reload else RELOAD_SECONDS)
                first_reload = False
            elif what == "status":
                self._poll_status()
                due["status"] = time.monotonic() + self.timings["status_s"]
            else:
                self._poll_curves()
                due["curves"] = time.monotonic() + self.poll_s


def _run_group(port: int, sessions: list[dict], first: int, run_id: int, timings: dict, begin: float, warmup: float,
               seconds: float, out) -> None:
    samples: list = []
    viewers = [Viewer(port=port, cookies=cookies, run_id=run_id, timings=timings, begin=begin, warmup=warmup,
                      deadline=begin + warmup + seconds, samples=samples, seed=first + i) for i, cookies in enumerate(sessions)]
    threads = [threading.Thread(target=v.run, daemon=True) for v in viewers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if out is not None:
        out.put(samples)
    return samples


def run_viewers(*, port: int, sessions: list[dict], run_id: int, warmup: float, seconds: float, samples: list,
                processes: int = 1) -> float:
    """Every viewer until the deadline, in `processes` client processes (each browser is a process of its
    own, so no viewer waits for another's interpreter lock); returns when measuring began (monotonic)."""
    timings = page_timings()
    begin = time.monotonic() + 1.0  # the client processes are started by then
    groups = [(i, sessions[i::processes]) for i in range(processes)]
    if processes == 1:
        samples.extend(_run_group(port, sessions, 0, run_id, timings, begin, warmup, seconds, None))
        return begin + warmup
    context = multiprocessing.get_context("fork")  # the children use no inherited connection: HTTP only
    queue = context.Queue()
    children = [context.Process(target=_run_group, args=(port, group, first * 10_000, run_id, timings, begin, warmup,
                                                         seconds, queue), daemon=True) for first, group in groups]
    for child in children:
        child.start()
    for _ in children:
        samples.extend(queue.get(timeout=warmup + seconds + 600))
    for child in children:
        child.join(timeout=30)
    return begin + warmup
