"""Create (once) the demo's staff login and print it; the password is kept under the data folder."""
from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the 'demo' superuser if missing and print its credentials."

    def handle(self, *args, **opts):
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
        self.stdout.write(f"Log in as: demo / {password}")
