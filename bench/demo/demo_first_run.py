"""Benchmark (not a test): time from `make demo` in a fresh clone to a first run finished in the browser.

    .venv/bin/python bench/demo/demo_first_run.py --clone-dir /tmp/eagle3web-demo --json

Clones this repository's HEAD, runs `make demo` there (venv, assets, login, web server, worker),
waits for the dashboard, then logs in with headless Chromium, launches a run with the form's
defaults and waits for all four stages to succeed. Prints the seconds of each phase.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

REPO = Path(__file__).resolve().parents[2]


def wait_for_http(url: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"make demo exited early:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clone-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    subprocess.run(["rm", "-rf", str(args.clone_dir)], check=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(args.clone_dir)], check=True)
    log = args.clone_dir / "make-demo.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_BROKER_URL", "EAGLE3WEB_"))}
    started = time.monotonic()
    proc = subprocess.Popen(["make", "demo", f"PORT={args.port}"], cwd=args.clone_dir, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{args.port}"
        wait_for_http(url + "/login/", 1800, proc, log)
        dashboard_up = time.monotonic() - started
        password = re.search(r"Log in as: demo / (\S+)", log.read_text()).group(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1280, "height": 2000})
            page.goto(url + "/runs/new/")
            page.fill("#id_username", "demo")
            page.fill("#id_password", password)
            page.click("button[type=submit]")
            expect(page.locator("#id_layer_ids")).to_have_value("2, 4, 5, 8")
            launched_at = time.monotonic()
            page.click("#launch-submit")
            expect(page.locator("#run-status")).to_have_text(re.compile("succeeded|failed|cancelled"), timeout=1_800_000)
            status = page.locator("#run-status").inner_text()
            run_seconds = time.monotonic() - launched_at
            page.wait_for_timeout(3000)
            page.screenshot(path=str(args.clone_dir / "first-run.png"), full_page=True)
            stages = {row.get_attribute("data-stage"): row.locator('[data-field="seconds"]').inner_text()
                      for row in page.locator("tr[data-stage]").all()}
            browser.close()
        result = {
            "make_demo_to_dashboard_s": round(dashboard_up, 1),
            "launch_to_finished_s": round(run_seconds, 1),
            "make_demo_to_first_finished_run_s": round(time.monotonic() - started, 1),
            "status": status,
            "stage_seconds": stages,
            "screenshot": str(args.clone_dir / "first-run.png"),
        }
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
