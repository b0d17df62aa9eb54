"""Verify an extraction's files against its manifest and target; non-zero exit on a failed check."""
from __future__ import annotations

import json
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from runs.management.command_user import command_user
from runs.data.extractions import extraction_verify
from runs.data.models import Extraction
from runs.data.selectors import extraction_list, extraction_summary
from workers.contract.errors import InputError


class Command(BaseCommand):
    help = "Verify extraction ID: headers only, or every value with --full."

    def add_arguments(self, parser):
        parser.add_argument("extraction_id", type=int)
        parser.add_argument("--full", action="store_true", help="scan values (NaNs, infinities), not only headers")
        parser.add_argument("--user", default="", help="act as this user (default: the 'cli' launcher account)")
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, extraction_id: int, full: bool, as_json: bool, user: str, **opts):
        try:
            extraction = extraction_list().get(pk=extraction_id)
        except Extraction.DoesNotExist:
            raise CommandError(f"no extraction with id {extraction_id}") from None
        try:
            extraction_verify(extraction=extraction, full=full, user=command_user(user))
        except (InputError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        summary = extraction_summary(extraction)
        if as_json:
            self.stdout.write(json.dumps(summary))
        else:
            for check in summary["verification"]["checks"]:
                self.stdout.write(f"{check['verdict']:>5}  {check['name']}: {check['message']}")
        if not summary["verification"]["passed"]:
            raise CommandError(f"extraction {extraction_id}: verification failed: {summary['verification']['failures']}")
