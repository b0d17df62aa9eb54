"""Create (once) the demo's staff login and print it; the password is kept under the data folder.

`make demo` starts the web server and two workers beside this command, and their start-up banners
and logs would bury a line printed once: the login is printed when the server answers, and again,
last, when every worker it names has reported ready."""
from __future__ import annotations

import secrets
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from runs.fleet.selectors import workers_started


class Command(BaseCommand):
    help = "Create the 'demo' superuser if missing and print its credentials."

    def add_arguments(self, parser):
        parser.add_argument("--wait-for", default="", metavar="URL",
                            help="first wait until the web server answers at URL, then print where to log in")
        parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for --wait-for")
        parser.add_argument("--workers", default="", metavar="NAMES",
                            help="comma-separated node names before the '@' (e.g. cpu,gpu): once each has a worker "
                                 "that reported ready, print the login again, last")
        parser.add_argument("--since", type=float, default=None, metavar="EPOCH",
                            help="workers count only if they started at this Unix time or later (default: now)")
        parser.add_argument("--workers-timeout", type=float, default=300.0, help="seconds to wait for --workers")

    def handle(self, *args, wait_for: str = "", timeout: float = 120.0, workers: str = "", since: float | None = None,
               workers_timeout: float = 300.0, **opts):
        since_at = datetime.fromtimestamp(time.time() if since is None else since, tz=timezone.utc)
        password = self._password()
        if wait_for:
            self._wait(wait_for, timeout)
            # After the server's start-up lines, where a person looks.
            self.stdout.write(f"\neagle3web is up: {wait_for}\n")
        self.stdout.write(f"Log in as: demo / {password}")
        names = [name.strip() for name in workers.split(",") if name.strip()]
        if names:
            ready = self._wait_for_workers(names, since_at, workers_timeout)
            # Again, last: the workers' banners and "ready." lines may come after the server answered.
            if ready:
                self.stdout.write("\nWorkers ready: " + "; ".join(f"{ready[n].name} takes {', '.join(ready[n].queues)}"
                                                                   for n in names if n in ready))
            if wait_for:
                self.stdout.write(f"eagle3web is up: {wait_for}")
            self.stdout.write(f"Log in as: demo / {password}")
        if wait_for:
            self.stdout.write("(Ctrl-C stops the web server and the workers)\n")

    def _password(self) -> str:
        secret_file = settings.DATA_DIR / "demo" / "login.txt"
        secret_file.parent.mkdir(parents=True, exist_ok=True)
        if secret_file.exists():
            password = secret_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            secret_file.write_text(password + "\n")
            secret_file.chmod(0o600)
        users = get_user_model()
        user, _ = users.objects.get_or_create(username="demo", defaults={"is_staff": True, "is_superuser": True})
        if not user.check_password(password):
            user.set_password(password)
            user.save()
        return password

    def _wait(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                return
            except urllib.error.HTTPError:
                return  # it answered (a login redirect or an error page is an answer)
            except OSError:
                if time.monotonic() > deadline:
                    raise CommandError(f"the web server did not answer at {url} within {timeout:.0f} s")
                time.sleep(0.3)

    def _wait_for_workers(self, names: list[str], since: datetime, timeout: float) -> dict:
        """The workers that reported ready (their first heartbeat, workers/orchestration/fleet.py) by the deadline.
        One missing is said on stderr, naming it, and the demo goes on: the pages work without it."""
        deadline = time.monotonic() + timeout
        while True:
            ready = workers_started(names=names, since=since)
            if len(ready) == len(names):
                return ready
            if time.monotonic() > deadline:
                missing = ", ".join(f"{name}@" for name in names if name not in ready)
                self.stderr.write(f"\nno worker {missing} reported ready within {timeout:.0f} s: its log above says "
                                  "why; stages on its queues wait until one does")
                return ready
            time.sleep(0.5)
