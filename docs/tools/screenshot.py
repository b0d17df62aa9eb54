"""The README's screenshot (docs/images/run-page.png): the demo's run page after a run finished, in
headless Chromium. Not part of the site (mkdocs.yml leaves tools/ out) nor of the tests.

    EAGLE3WEB_DATA_DIR=/tmp/shot .venv/bin/python docs/tools/screenshot.py --assets DIR --port 8765

DIR holds a demo build (`manage.py build_demo_assets DIR`: demo-target/, demo-chats.jsonl); the
script migrates an SQLite database under the data folder, runs one pipeline inline with the demo's
login, starts the web server and photographs /runs/<id>/ at 1280 px."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.tracker.web_server import runserver  # noqa: E402


def manage(*args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--run", type=int, help="photograph this run instead of running a new one")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "run-page.png")
    args = parser.parse_args()
    manage("migrate", "--noinput", "-v", "0")
    password = re.search(r"Log in as: demo / (\S+)", manage("demo_login")).group(1)
    run_id = args.run or json.loads(manage("run_pipeline", "--target", str(args.assets / "demo-target"),
                                "--dataset", str(args.assets / "demo-chats.jsonl"), "--user", "demo",
                                "--name", "demo-first-run", "--epochs", "2", "--inline", "--json"))["run_id"]
    with runserver(port=args.port) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url + "/login/")
        page.fill("#id_username", "demo")
        page.fill("#id_password", password)
        page.click("button[type=submit]")
        page.goto(f"{url}/runs/{run_id}/")
        page.wait_for_load_state("networkidle")
        time.sleep(2)  # the charts draw after their first poll
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        browser.close()
    print(json.dumps({"run": run_id, "png": str(args.out)}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
