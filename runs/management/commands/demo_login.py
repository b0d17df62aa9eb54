"""Create (once) the demo's staff login and print it; the password is kept under the data folder."""
from __future__ import annotations

import secrets
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create the 'demo' superuser if missing and print its credentials."

    def add_arguments(self, parser):
        parser.add_argument("--wait-for", default="", metavar="URL",
                            help="first wait until the web server answers at URL, then print where to log in")
        parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for --wait-for")

    def handle(self, *args, wait_for: str = "", timeout: float = 120.0, **opts):
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
        if wait_for:
            self._wait(wait_for, timeout)
            # Last, after the worker's and the server's start-up banners, where a person looks.
            self.stdout.write(f"\neagle3web is up: {wait_for}\n")
        self.stdout.write(f"Log in as: demo / {password}")
        if wait_for:
            self.stdout.write("(Ctrl-C stops the web server and the worker)\n")

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
