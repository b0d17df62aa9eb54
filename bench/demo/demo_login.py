"""Benchmark (not a test): seconds from `make demo` in a fresh clone to the login printed, with the
dependencies installed, then to the demo target built by the cpu worker; then a second `make demo` in
the same clone (everything reused).

    .venv/bin/python bench/demo/demo_login.py --clone-dir /tmp/eagle3web-login --json

Clones this repository's HEAD and links this checkout's .venv into it (the dependencies installed:
`make -o .venv/.installed` does not reinstall them, as in a clone where `make setup` ran once). Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOGIN = re.compile(r"Log in as: demo / \S+")
BUILT = re.compile(r"demo_build \d+ finished|Demo target already built")


def wait_for(pattern: re.Pattern, log: Path, proc: subprocess.Popen, started: float, timeout: float) -> float | None:
    """Seconds from `started` until the log shows `pattern`; None past `timeout`."""
    while time.monotonic() - started < timeout:
        if pattern.search(log.read_text(errors="replace")):
            return round(time.monotonic() - started, 1)
        if proc.poll() is not None:
            raise SystemExit(f"make demo exited early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return None


def make_demo(clone: Path, port: int, log: Path, env: dict, build_timeout: float) -> dict:
    started = time.monotonic()
    proc = subprocess.Popen(["make", "-o", ".venv/.installed", "demo", f"PORT={port}"], cwd=clone, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        login = wait_for(LOGIN, log, proc, started, 600)
        built = wait_for(BUILT, log, proc, started, build_timeout)
        return {"login_s": login, "demo_target_ready_s": built,
                "reused_build": "Demo target already built" in log.read_text(errors="replace")}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clone-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--build-timeout", type=float, default=1800)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    subprocess.run(["rm", "-rf", str(args.clone_dir)], check=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(args.clone_dir)], check=True)
    (args.clone_dir / ".venv").symlink_to((REPO / ".venv").resolve())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_BROKER_URL", "EAGLE3WEB_"))}
    load = os.getloadavg()[0]
    first = make_demo(args.clone_dir, args.port, args.clone_dir / "make-demo-1.log", env, args.build_timeout)
    second = make_demo(args.clone_dir, args.port, args.clone_dir / "make-demo-2.log", env, 120)
    result = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True).stdout.strip(),
              "cpus": os.cpu_count(), "load_1min_at_start": round(load, 1), "first": first, "second": second}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
