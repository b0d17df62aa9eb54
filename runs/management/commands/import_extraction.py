"""Register an extraction made elsewhere (flat v1, speculators v0.4 or 0.9) and verify its headers."""
from __future__ import annotations

import json

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.management.command_user import command_user
from runs.data.extractions import extraction_import
from runs.data.selectors import extraction_summary
from workers.contract.errors import InputError


class Command(BaseCommand):
    help = "Import a hidden-state extraction directory; idempotent. Exits non-zero if its verification failed."

    def add_arguments(self, parser):
        parser.add_argument("directory")
        parser.add_argument("--target", default=None, help="target model directory (default: the manifest's model_path)")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, directory: str, target: str | None, as_json: bool, user: str, **opts):
        try:
            extraction, created = extraction_import(path=directory, target_path=target, user=command_user(user))
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        summary = {**extraction_summary(extraction), "created": created}
        self.stdout.write(json.dumps(summary) if as_json else
                          f"extraction {extraction.pk} ({extraction.layout}) {'imported' if created else 'already imported'}")
        if not summary["verification"]["passed"]:
            raise CommandError(f"extraction {extraction.pk}: verification failed: {summary['verification']['failures']}")
